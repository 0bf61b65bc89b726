// Behaviour of the Jinja engine on small templates; the real chat templates are compared
// with @huggingface/jinja in tokenizer_reference_test.cc.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_value.h"

namespace kvfleet::tok::jinja {
namespace {

using json = nlohmann::json;

std::string Render(std::string_view source, const json& context = json::object()) {
  auto t = Template::Parse(source);
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  auto out = (*t)->Render(context);
  REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  return *out;
}

TEST_CASE("whitespace control: - strips, trim_blocks and lstrip_blocks apply as in transformers") {
  CHECK(Render("a  {{- 'b' -}}  c") == "abc");
  CHECK(Render("{% if true %}\nyes\n{% endif %}\n") == "yes\n");
  CHECK(Render("x\n    {% if true %}y{% endif %}") == "x\ny");
  CHECK(Render("{# note #}z") == "z");
}

TEST_CASE("loops: loop variables, else, filters on the iterable, break and continue") {
  json ctx = {{"xs", {1, 2, 3, 4}}};
  CHECK(Render("{% for x in xs %}{{ loop.index0 }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", ctx) ==
        "01,12,23,34");
  CHECK(Render("{% for x in xs if x is even %}{{ x }}{% endfor %}", ctx) == "24");
  CHECK(Render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}") == "empty");
  CHECK(Render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
               ctx) == "13");
  CHECK(Render("{% for x in xs[::-1] %}{{ x }}{% endfor %}|{{ xs[1:3] }}|{{ xs[-1] }}", ctx) == "4321|[2, 3]|4");
  CHECK(Render("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", "x"}}}}) == "a=1;b=x;");
}

TEST_CASE("namespaces carry values out of loops; plain sets do not") {
  std::string t =
      "{% set ns = namespace(n=0) %}{% set m = 0 %}{% for x in xs %}{% set ns.n = ns.n + x %}{% set m = m + x %}"
      "{% endfor %}{{ ns.n }},{{ m }}";
  CHECK(Render(t, {{"xs", {1, 2, 3}}}) == "6,0");
}

TEST_CASE("expressions, tests and string methods follow the reference") {
  json ctx = {{"s", "  Hello, World  "}, {"m", {{"role", "user"}, {"content", "a</think>b"}}}};
  CHECK(Render("{{ s | trim }}|{{ s.strip() }}|{{ s.lstrip('\\n') | length }}", ctx) == "Hello, World|Hello, World|14");
  CHECK(Render("{{ m.content.split('</think>')[-1] }}{{ '</think>' in m.content }}", ctx) == "btrue");
  CHECK(Render("{{ m.missing is defined }}{{ m.role is string }}{{ none is none }}{{ 1 if m.x else 2 }}", ctx) ==
        "falsetruetrue2");
  CHECK(Render("{{ 7 // 2 }} {{ 7 / 2 }} {{ 2 ** 3 }} {{ 'a' ~ 1 }} {{ 'ab' + 'c' }} {{ -3 + 1 }}") == "3 3.5 8 a1 abc -2");
  CHECK(Render("{{ x | tojson }}", {{"x", {{"a", {1, "é"}}, {"b", nullptr}}}}) == "{\"a\": [1, \"é\"], \"b\": null}");
  CHECK(Render("{{ x | tojson(indent=2) }}", {{"x", {{"a", {1, 2}}}}}) == "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
  CHECK(Render("{{ 'a-b-c'.replace('-', '+', 1) }} {{ 'x'.upper() }} {{ ['a','b'] | join(', ') }}") == "a+b-c X a, b");
  CHECK(Render("{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}{{ greet('bob') }}") == "hi bob!");
}

// Regression: template variables went through nlohmann::json, which sorts object keys, so
// `tojson` and items() printed {"content": ..., "role": ...} where transformers prints the
// keys as the message gave them.
TEST_CASE("objects keep their keys in the order given: tojson, items() and for loops") {
  auto t = Template::Parse(
      "{{ m | tojson }}|{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in m %}{{ k }}{% endfor %}");
  REQUIRE(t.ok());
  auto out = (*t)->Render(nlohmann::ordered_json::parse(R"({"m": {"role": "user", "content": "hi", "name": "x"}})"));
  REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  CHECK(*out == R"({"role": "user", "content": "hi", "name": "x"}|role=user;content=hi;name=x;|rolecontentname)");
  // sort_keys still sorts, as Python's json.dumps does.
  CHECK(Render("{{ m | tojson(sort_keys=true) }}", {{"m", {{"b", 1}, {"a", 2}}}}) == R"({"a": 2, "b": 1})");
}

TEST_CASE("raise_exception and unsupported constructs fail with a message naming them") {
  auto t = Template::Parse("{{ raise_exception('no system role') }}");
  REQUIRE(t.ok());
  auto out = (*t)->Render(json::object());
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().message().find("no system role") != std::string::npos);

  auto include = Template::Parse("{% include 'x.jinja' %}");
  REQUIRE_FALSE(include.ok());
  CHECK(include.status().message().find("include") != std::string::npos);

  auto filter = Template::Parse("{{ xs | wordwrap }}");
  REQUIRE(filter.ok());
  auto rendered = (*filter)->Render({{"xs", "abc"}});
  REQUIRE_FALSE(rendered.ok());
  CHECK(rendered.status().message().find("wordwrap") != std::string::npos);

  CHECK_FALSE(Template::Parse("{% if x %}unterminated").ok());
  CHECK_FALSE(Template::Parse("{{ 'unterminated }}").ok());
}

std::string RenderError(std::string_view source) {
  auto t = Template::Parse(source);
  if (!t.ok()) return t.status().message();
  auto out = (*t)->Render(json::object());
  REQUIRE_MESSAGE(!out.ok(), *out);
  return out.status().message();
}

TEST_CASE("integers stay within 64 bits: overflow is an error, never a wrapped or undefined value") {
  CHECK(RenderError("{{ 777 ** 7 }}").find("64-bit") != std::string::npos);
  CHECK(RenderError("{{ 9223372036854775807 + 1 }}").find("overflow") != std::string::npos);
  CHECK(RenderError("{{ -9223372036854775807 - 2 }}").find("overflow") != std::string::npos);
  CHECK(RenderError("{{ 4294967296 * 4294967296 }}").find("overflow") != std::string::npos);
  CHECK(RenderError("{{ (2 ** 70) | int }}").find("64-bit") != std::string::npos);
  CHECK(RenderError("{{ 99999999999999999999 }}").find("64 bits") != std::string::npos);
  CHECK(Render("{{ (-9223372036854775807 - 1) % -1 }} {{ 7 % -1 }} {{ -7 % 2 }}") == "0 0 -1");
  CHECK(Render("{{ [1, 2, 3][1::9223372036854775807] }} {{ range(9223372036854775806, 9223372036854775807, 5) }}") ==
        "[2] [9223372036854775806]");
  CHECK(RenderError("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
            .find("limit") != std::string::npos);
}

TEST_CASE("a whole number past a long long prints as JavaScript does, shortest digits then zeros") {
  CHECK(JsNumber(22222222222222222233.76) == "22222222222222220000");  // the fuzzer's input, once a crash
  CHECK(JsNumber(-1e20) == "-100000000000000000000");
  CHECK(JsNumber(12345) == "12345");
}

}  // namespace
}  // namespace kvfleet::tok::jinja
