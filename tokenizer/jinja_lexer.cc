// The Jinja lexer, following @huggingface/jinja's lexer.ts rule for rule: the
// trim_blocks / lstrip_blocks preprocessing, whitespace control, unary minus and string
// escapes, so that a template tokenizes the same way there and here.
#include <cctype>
#include <stdexcept>
#include <utility>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok::jinja {

namespace {

struct SyntaxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool IsWhitespaceAt(std::string_view s, size_t i) {
  if (i >= s.size()) return false;
  size_t j = i;
  return IsJsWhitespace(NextCodePoint(s, &j));
}
size_t WhitespaceLength(std::string_view s, size_t i) {
  size_t j = i;
  NextCodePoint(s, &j);
  return j - i;
}
bool IsWord(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// transformers renders chat templates with trim_blocks and lstrip_blocks; the reference
// emulates them with these rewrites of the source, and drops one trailing newline.
std::string Preprocess(std::string_view source) {
  std::string s(source);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  // lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1"
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    bool line_start = i == 0 || s[i - 1] == '\n' || s[i - 1] == '\r';
    if (line_start) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j + 1 < s.size() && s[j] == '{' && (s[j + 1] == '#' || s[j + 1] == '%' || s[j + 1] == '-')) i = j;
    }
    // JS's multiline ^ also follows U+2028 / U+2029.
    if (i >= 3 && static_cast<unsigned char>(s[i - 3]) == 0xE2 && static_cast<unsigned char>(s[i - 2]) == 0x80 &&
        (static_cast<unsigned char>(s[i - 1]) == 0xA8 || static_cast<unsigned char>(s[i - 1]) == 0xA9)) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j + 1 < s.size() && s[j] == '{' && (s[j + 1] == '#' || s[j + 1] == '%' || s[j + 1] == '-')) i = j;
    }
    if (i < s.size()) out.push_back(s[i++]);
  }
  // trim_blocks: /([#%-]})\n/g -> "$1"
  std::string trimmed;
  trimmed.reserve(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    trimmed.push_back(out[i]);
    if (out[i] == '}' && i > 0 && (out[i - 1] == '#' || out[i - 1] == '%' || out[i - 1] == '-') && i + 1 < out.size() &&
        out[i + 1] == '\n') {
      ++i;
    }
  }
  return trimmed;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      if (tokens_.empty() || Last() == TokenType::kCloseStatement || Last() == TokenType::kCloseExpression ||
          Last() == TokenType::kComment) {
        std::string text;
        while (pos_ < src_.size() &&
               !(src_[pos_] == '{' && pos_ + 1 < src_.size() &&
                 (src_[pos_ + 1] == '%' || src_[pos_ + 1] == '{' || src_[pos_ + 1] == '#'))) {
          text.push_back(src_[pos_++]);
        }
        if (!text.empty()) {
          tokens_.push_back({std::move(text), TokenType::kText});
          continue;
        }
      }
      if (At("{#")) {
        LexComment();
        continue;
      }
      if (At("{%-")) {
        StripTrailingWhitespace();
        tokens_.push_back({"{%", TokenType::kOpenStatement});
        pos_ += 3;
        continue;
      }
      if (At("{{-")) {
        StripTrailingWhitespace();
        tokens_.push_back({"{{", TokenType::kOpenExpression});
        curly_depth_ = 0;
        pos_ += 3;
        continue;
      }
      while (IsWhitespaceAt(src_, pos_)) pos_ += WhitespaceLength(src_, pos_);
      if (pos_ >= src_.size()) break;
      if (At("-%}")) {
        tokens_.push_back({"%}", TokenType::kCloseStatement});
        pos_ += 3;
        SkipLeadingWhitespace();
        continue;
      }
      if (At("-}}")) {
        tokens_.push_back({"}}", TokenType::kCloseExpression});
        pos_ += 3;
        SkipLeadingWhitespace();
        continue;
      }
      char c = src_[pos_];
      if ((c == '-' || c == '+') && LexUnary(c)) continue;
      if (LexOperator()) continue;
      if (c == '\'' || c == '"') {
        ++pos_;
        std::string s = ConsumeString(c);
        tokens_.push_back({std::move(s), TokenType::kStringLiteral});
        ++pos_;
        continue;
      }
      if (IsDigit(c)) {
        std::string num = ConsumeDigits();
        if ((tokens_.empty() || Last() != TokenType::kDot) && pos_ + 1 < src_.size() && src_[pos_] == '.' &&
            IsDigit(src_[pos_ + 1])) {
          ++pos_;
          num.push_back('.');
          num += ConsumeDigits();
        }
        tokens_.push_back({std::move(num), TokenType::kNumericLiteral});
        continue;
      }
      if (IsWord(c)) {
        std::string word;
        while (pos_ < src_.size() && IsWord(src_[pos_])) word.push_back(src_[pos_++]);
        tokens_.push_back({std::move(word), TokenType::kIdentifier});
        continue;
      }
      throw SyntaxError(std::string("unexpected character '") + c + "'");
    }
    return std::move(tokens_);
  }

 private:
  TokenType Last() const { return tokens_.back().type; }
  bool At(std::string_view s) const { return src_.compare(pos_, s.size(), s) == 0; }

  void StripTrailingWhitespace() {
    if (tokens_.empty() || Last() != TokenType::kText) return;
    std::string& v = tokens_.back().value;
    v = std::string(TrimEndJs(v));
    if (v.empty()) tokens_.pop_back();
  }
  void SkipLeadingWhitespace() {
    while (IsWhitespaceAt(src_, pos_)) pos_ += WhitespaceLength(src_, pos_);
  }

  void LexComment() {
    pos_ += 2;
    bool strip_before = pos_ < src_.size() && src_[pos_] == '-';
    if (strip_before) ++pos_;
    std::string comment;
    while (!(pos_ + 1 < src_.size() && src_[pos_] == '#' && src_[pos_ + 1] == '}')) {
      if (pos_ + 2 >= src_.size()) throw SyntaxError("missing end of comment tag");
      comment.push_back(src_[pos_++]);
    }
    bool strip_after = !comment.empty() && comment.back() == '-';
    if (strip_after) comment.pop_back();
    if (strip_before) StripTrailingWhitespace();
    tokens_.push_back({std::move(comment), TokenType::kComment});
    pos_ += 2;
    if (strip_after) SkipLeadingWhitespace();
  }

  // A '-' or '+' that starts a unary operator (or a signed number literal).
  bool LexUnary(char c) {
    if (tokens_.empty() || Last() == TokenType::kText) throw SyntaxError(std::string("unexpected character '") + c + "'");
    switch (Last()) {
      case TokenType::kIdentifier: case TokenType::kNumericLiteral: case TokenType::kStringLiteral:
      case TokenType::kCloseParen: case TokenType::kCloseSquareBracket:
        return false;  // a binary operator
      default:
        break;
    }
    ++pos_;
    std::string num = ConsumeDigits();
    if (!num.empty() && pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigit(src_[pos_ + 1])) {
      ++pos_;
      num.push_back('.');
      num += ConsumeDigits();
    }
    std::string text(1, c);
    text += num;
    tokens_.push_back({std::move(text), num.empty() ? TokenType::kUnaryOperator : TokenType::kNumericLiteral});
    return true;
  }

  bool LexOperator() {
    static const std::pair<const char*, TokenType> kTable[] = {
        {"{%", TokenType::kOpenStatement}, {"%}", TokenType::kCloseStatement},
        {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
        {"(", TokenType::kOpenParen}, {")", TokenType::kCloseParen},
        {"{", TokenType::kOpenCurlyBracket}, {"}", TokenType::kCloseCurlyBracket},
        {"[", TokenType::kOpenSquareBracket}, {"]", TokenType::kCloseSquareBracket},
        {",", TokenType::kComma}, {".", TokenType::kDot}, {":", TokenType::kColon}, {"|", TokenType::kPipe},
        {"<=", TokenType::kComparisonBinaryOperator}, {">=", TokenType::kComparisonBinaryOperator},
        {"==", TokenType::kComparisonBinaryOperator}, {"!=", TokenType::kComparisonBinaryOperator},
        {"<", TokenType::kComparisonBinaryOperator}, {">", TokenType::kComparisonBinaryOperator},
        {"+", TokenType::kAdditiveBinaryOperator}, {"-", TokenType::kAdditiveBinaryOperator},
        {"~", TokenType::kAdditiveBinaryOperator}, {"**", TokenType::kExponentiationBinaryOperator},
        {"*", TokenType::kMultiplicativeBinaryOperator}, {"//", TokenType::kMultiplicativeBinaryOperator},
        {"/", TokenType::kMultiplicativeBinaryOperator}, {"%", TokenType::kMultiplicativeBinaryOperator},
        {"=", TokenType::kEquals},
    };
    for (const auto& [seq, type] : kTable) {
      std::string_view s(seq);
      if (s == "}}" && curly_depth_ > 0) continue;  // inside an object literal
      if (!At(s)) continue;
      tokens_.push_back({std::string(s), type});
      if (type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (type == TokenType::kOpenCurlyBracket) ++curly_depth_;
      if (type == TokenType::kCloseCurlyBracket) --curly_depth_;
      pos_ += s.size();
      return true;
    }
    return false;
  }

  std::string ConsumeDigits() {
    std::string s;
    while (pos_ < src_.size() && IsDigit(src_[pos_])) s.push_back(src_[pos_++]);
    return s;
  }

  std::string ConsumeString(char quote) {
    std::string s;
    while (pos_ < src_.size() && src_[pos_] != quote) {
      if (src_[pos_] == '\\') {
        if (++pos_ >= src_.size()) throw SyntaxError("unexpected end of input");
        char e = src_[pos_++];
        if (e == 'x' || e == 'u') {
          size_t n = e == 'x' ? 2 : 4;
          std::string hex = src_.substr(pos_, n);
          if (hex.size() != n || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
            throw SyntaxError("invalid hexadecimal escape sequence");
          }
          AppendUtf8(static_cast<char32_t>(std::stoul(hex, nullptr, 16)), &s);
          pos_ += n;
          continue;
        }
        switch (e) {
          case 'n': s.push_back('\n'); break;
          case 't': s.push_back('\t'); break;
          case 'r': s.push_back('\r'); break;
          case 'b': s.push_back('\b'); break;
          case 'f': s.push_back('\f'); break;
          case 'v': s.push_back('\v'); break;
          case '\'': case '"': case '\\': s.push_back(e); break;
          default: throw SyntaxError(std::string("unexpected escaped character '") + e + "'");
        }
        continue;
      }
      s.push_back(src_[pos_++]);
    }
    if (pos_ >= src_.size()) throw SyntaxError("unterminated string literal");
    return s;
  }

  std::string src_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> Tokenize(std::string_view source) {
  if (!IsValidUtf8(source)) return InvalidArgument("jinja: template is not valid UTF-8");
  try {
    return Lexer(Preprocess(source)).Run();
  } catch (const SyntaxError& e) {
    return InvalidArgument(std::string("jinja syntax: ") + e.what());
  } catch (const std::exception& e) {  // std::stoul etc.
    return InvalidArgument(std::string("jinja syntax: ") + e.what());
  }
}

}  // namespace kvfleet::tok::jinja
