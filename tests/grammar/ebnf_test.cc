// EBNF, regex and choice specs: what they accept, their errors, and the size limits.
#include "grammar/ebnf_parser.h"
#include "tests/grammar/grammar_test_util.h"

namespace kvfleet::grammar {
namespace {

using testing::ByteVocab;
using testing::MatchBytes;
using testing::MustCompile;

std::string ErrorOf(const Spec& spec, const Limits& limits = {}) {
  Status st = Validate(spec, limits);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  return st.message();
}

TEST_CASE("an EBNF grammar accepts exactly its language") {
  auto g = MustCompile({Kind::kEbnf, R"(
    # a list of small numbers or words
    root ::= "[" item ("," item)* "]"
    item ::= [0-9]{1,3} | word
    word ::= [a-z]+ ("-" [a-z]+)?
  )"}, ByteVocab());
  CHECK(MatchBytes(g, "[1]"));
  CHECK(MatchBytes(g, "[123,abc,x-y]"));
  CHECK_FALSE(MatchBytes(g, "[1234]"));
  CHECK_FALSE(MatchBytes(g, "[]"));
  CHECK_FALSE(MatchBytes(g, "[a-]"));
  CHECK_FALSE(MatchBytes(g, "[1,"));  // a prefix is accepted byte by byte but cannot end
}

TEST_CASE("EBNF literals take escapes, classes take ranges and negation, '.' any character") {
  auto g = MustCompile({Kind::kEbnf, R"(root ::= "\"" [^"\\\n]* "\"" ( '\t' | "\u00e9" | . )?)"}, ByteVocab());
  CHECK(MatchBytes(g, "\"abc\""));
  CHECK(MatchBytes(g, "\"ab\"\t"));
  CHECK(MatchBytes(g, "\"\"\xC3\xA9"));
  CHECK(MatchBytes(g, "\"\"\xE2\x82\xAC"));     // '.' is one codepoint of any length
  CHECK_FALSE(MatchBytes(g, "\"\"\xE2\x82"));   // an incomplete one cannot end
  CHECK_FALSE(MatchBytes(g, "\"a\\b\""));
  CHECK_FALSE(MatchBytes(g, "\"\"\xFF"));       // never valid UTF-8
}

TEST_CASE("repetition bounds {m}, {m,}, {m,n} are exact") {
  auto g = MustCompile({Kind::kEbnf, R"(root ::= "a"{2} "b"{1,} "c"{0,2})"}, ByteVocab());
  CHECK(MatchBytes(g, "aab"));
  CHECK(MatchBytes(g, "aabbbcc"));
  CHECK_FALSE(MatchBytes(g, "ab"));
  CHECK_FALSE(MatchBytes(g, "aaab"));
  CHECK_FALSE(MatchBytes(g, "aabccc"));
}

TEST_CASE("a grammar printed as EBNF parses back to the same language") {
  auto parsed = ParseEbnf(R"(root ::= ("x" | [a-c\]\-]{2,3})+ tail?
tail ::= "\"q\\" [^\u0000-\u001f] "\xFF")");
  REQUIRE(parsed.ok());
  std::string text = parsed->ToEbnf();
  auto again = ParseEbnf(text);
  REQUIRE_MESSAGE(again.ok(), text);
  CHECK(again->ToEbnf() == text);
  auto g = MustCompile({Kind::kEbnf, text}, ByteVocab());
  CHECK(MatchBytes(g, "xab]"));
  CHECK(MatchBytes(g, "x\"q\\z\xFF"));
  CHECK_FALSE(MatchBytes(g, "a"));
}

TEST_CASE("EBNF errors name the line and column") {
  CHECK(ErrorOf({Kind::kEbnf, "root ::= \"a\"\nitem ::= [a-z\n"}).find("line 2") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= \"a\" )"}).find("line 1, column 14") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= item"}).find("'item' is used at line 1, column 14") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "item ::= \"a\""}).find("no rule named 'root'") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= \"a\"\nroot ::= \"b\""}).find("defined twice") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= \"\\q\""}).find("unknown escape") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= \"a\"{3,2}"}).find("n < m") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= [z-a]"}).find("out of order") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= root \"a\" | \"b\""}).find("left-recursive through rule 'root'") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= \"a\" root"}).find("matches no finite string") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, "root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')')}).find("nested deeper") != std::string::npos);
}

TEST_CASE("a regex spec matches the whole text") {
  auto g = MustCompile({Kind::kRegex, R"(^(?:[A-Z][a-z]+|\d{2,3})(-\w+)*\.?$)"}, ByteVocab());
  CHECK(MatchBytes(g, "Hello"));
  CHECK(MatchBytes(g, "12-a_b-C9."));
  CHECK_FALSE(MatchBytes(g, "hello"));
  CHECK_FALSE(MatchBytes(g, "1234"));
  auto dot = MustCompile({Kind::kRegex, R"(a.c[^x]\s\S\D\W)"}, ByteVocab());
  CHECK(MatchBytes(dot, "a\xC3\xA9" "cy\ta!!"));
  CHECK_FALSE(MatchBytes(dot, "a\ncy\ta!!"));  // '.' excludes line terminators
  auto alts = MustCompile({Kind::kRegex, R"(^ab$|^c$)"}, ByteVocab());
  CHECK(MatchBytes(alts, "ab"));
  CHECK(MatchBytes(alts, "c"));
  CHECK_FALSE(MatchBytes(alts, "abc"));
  auto braces = MustCompile({Kind::kRegex, R"(x{a}|y{2}|\{)"}, ByteVocab());
  CHECK(MatchBytes(braces, "x{a}"));
  CHECK(MatchBytes(braces, "yy"));
  CHECK(MatchBytes(braces, "{"));
}

TEST_CASE("unsupported regex features are named") {
  CHECK(ErrorOf({Kind::kRegex, R"((a)\1)"}).find("backreference") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"(a(?=b))"}).find("lookahead") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"((?<!a)b)"}).find("lookbehind") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"(\bword)"}).find("word boundary") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"(a^b)"}).find("anchor '^'") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"((a$)b)"}).find("anchor '$'") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"(\p{L})"}).find("Unicode property") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"((?i)abc)"}).find("group flag") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"((ab)"}).find("missing ')'") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"(a**)"}).find("nothing to repeat") != std::string::npos);
}

TEST_CASE("a choice accepts exactly one of its strings") {
  auto g = MustCompile({Kind::kChoice, R"(["yes", "no", "not sure", "caf\u00e9"])"}, ByteVocab());
  CHECK(MatchBytes(g, "yes"));
  CHECK(MatchBytes(g, "not sure"));
  CHECK(MatchBytes(g, "caf\xC3\xA9"));
  CHECK_FALSE(MatchBytes(g, "not"));
  CHECK_FALSE(MatchBytes(g, "yesno"));
  CHECK(ErrorOf({Kind::kChoice, "[]"}).find("empty") != std::string::npos);
  CHECK(ErrorOf({Kind::kChoice, R"(["a", 1])"}).find("element 1") != std::string::npos);
  CHECK(ErrorOf({Kind::kChoice, "{"}).find("JSON array") != std::string::npos);
}

TEST_CASE("specs built to explode fail fast with 'grammar too large'") {
  Limits small;
  small.max_states = 20000;
  CHECK(ErrorOf({Kind::kEbnf, R"(root ::= [a-z]{0,100000})"}).find("grammar too large") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, R"(root ::= ("a"{0,2000000000}){0,2000000000})"}).find("grammar too large") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, R"(root ::= (""){0,2000000000})"}).find("grammar too large") != std::string::npos);
  CHECK(ErrorOf({Kind::kEbnf, R"(root ::= "a")" + std::string(5000, '?')}).find("grammar too large") != std::string::npos);
  // (a|b)*a(a|b){20}: the subset construction's classic 2^20 blow-up.
  CHECK(ErrorOf({Kind::kRegex, R"([ab]*a[ab]{20})"}, small).find("grammar too large") != std::string::npos);
  CHECK(ErrorOf({Kind::kRegex, R"(x{99999999999})"}).find("grammar too large") != std::string::npos);
  Limits tiny_spec;
  tiny_spec.max_spec_bytes = 10;
  CHECK(ErrorOf({Kind::kRegex, "abcdefghijklmnop"}, tiny_spec).find("grammar too large") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::grammar
