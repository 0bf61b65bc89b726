// The Jinja interpreter: environments, operators, filters, tests and methods as
// @huggingface/jinja's runtime.ts defines them (including its departures from Python
// Jinja, e.g. str.strip(chars) ignoring `chars`), so renders agree byte for byte.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <stdexcept>

#include <utf8proc.h>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_internal.h"
#include "tokenizer/jinja_value.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok::jinja {

// A variable scope; lookups walk to the parent.
class Env {
 public:
  explicit Env(Env* parent = nullptr) : parent_(parent) {}
  void Set(const std::string& name, ValuePtr v) {
    for (auto& [k, old] : vars_) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars_.emplace_back(name, std::move(v));
  }
  ValuePtr Lookup(const std::string& name) const {
    for (const Env* e = this; e; e = e->parent_) {
      for (const auto& [k, v] : e->vars_) {
        if (k == name) return v;
      }
    }
    return Undefined();
  }

 private:
  Env* parent_;
  std::vector<std::pair<std::string, ValuePtr>> vars_;
};

namespace {

namespace config {
// Macro calls nest at most this deep (recursive macros would otherwise exhaust the stack).
constexpr int kMaxCallDepth = 64;
// A render producing more than this is stopped (loops over huge ranges, exponential macros).
constexpr size_t kMaxOutputBytes = 64 << 20;
// range() longer than this is refused.
constexpr size_t kMaxRange = 1 << 20;
}  // namespace config

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  std::string Block(const std::vector<std::unique_ptr<Node>>& body, Env& env, Flow* flow) {
    std::string out;
    for (const auto& s : body) {
      ValuePtr v = Eval(*s, env, flow);
      if (v->kind != Kind::kNull && v->kind != Kind::kUndefined) out += Display(*v);
      if (out.size() > config::kMaxOutputBytes) throw RenderError("the template's output exceeds the limit");
      if (*flow != Flow::kNormal) break;
    }
    return out;
  }

  ValuePtr Eval(const Node& n, Env& env, Flow* flow) {
    switch (n.kind) {
      case NodeKind::kProgram: return Str(Block(n.body, env, flow));
      case NodeKind::kSet: return EvalSet(n, env, flow);
      case NodeKind::kIf: {
        ValuePtr test = Expr(*n.a, env);
        return Str(Block(Truthy(*test) ? n.body : n.alternate, env, flow));
      }
      case NodeKind::kFor: return EvalFor(n, env);
      case NodeKind::kMacro: return EvalMacro(n, env);
      case NodeKind::kCallStatement: return EvalCallStatement(n, env);
      case NodeKind::kFilterStatement: {
        Flow inner = Flow::kNormal;
        ValuePtr body = Str(Block(n.body, env, &inner));
        return ApplyFilter(body, *n.a, env);
      }
      case NodeKind::kBreak: *flow = Flow::kBreak; return Null();
      case NodeKind::kContinue: *flow = Flow::kContinue; return Null();
      case NodeKind::kComment: return Null();
      default: return Expr(n, env);
    }
  }

  ValuePtr Expr(const Node& n, Env& env) {
    switch (n.kind) {
      case NodeKind::kIntegerLiteral: return Int(n.integer);
      case NodeKind::kFloatLiteral: return Float(n.number);
      case NodeKind::kStringLiteral: return Str(n.text);
      case NodeKind::kArrayLiteral:
      case NodeKind::kTupleLiteral: {
        std::vector<ValuePtr> items;
        for (const auto& x : n.args) items.push_back(Expr(*x, env));
        return Array(std::move(items), n.kind == NodeKind::kTupleLiteral ? Kind::kTuple : Kind::kArray);
      }
      case NodeKind::kObjectLiteral: {
        auto o = std::make_shared<Object>();
        for (size_t i = 0; i + 1 < n.args.size(); i += 2) {
          ValuePtr k = Expr(*n.args[i], env);
          if (k->kind != Kind::kString) throw RenderError(std::string("object keys must be strings: got ") + TypeName(*k));
          o->Set(k->str, Expr(*n.args[i + 1], env));
        }
        return MakeObject(std::move(o));
      }
      case NodeKind::kIdentifier: return env.Lookup(n.text);
      case NodeKind::kMember: return EvalMember(n, env);
      case NodeKind::kCall: {
        std::vector<ValuePtr> args = Arguments(n.args, env, true);
        ValuePtr fn = Expr(*n.a, env);
        if (fn->kind != Kind::kFunction) throw RenderError(std::string("cannot call something that is not a function: got ") + TypeName(*fn));
        return fn->fn(args, env);
      }
      case NodeKind::kUnary: {
        ValuePtr v = Expr(*n.a, env);
        if (n.text == "not") return Bool(!Truthy(*v));
        if (v->kind == Kind::kInt || v->kind == Kind::kFloat || v->kind == Kind::kBool) {
          double sign = n.text == "-" ? -1 : 1;
          if (v->kind == Kind::kFloat) return Float(sign * v->number);
          return Int(static_cast<int64_t>(sign) * (v->kind == Kind::kBool ? (v->boolean ? 1 : 0) : v->integer));
        }
        throw RenderError("unknown operator '" + n.text + "' for " + TypeName(*v));
      }
      case NodeKind::kBinary: return EvalBinary(n, env);
      case NodeKind::kFilter: return ApplyFilter(Expr(*n.a, env), *n.b, env);
      case NodeKind::kTest: {
        ValuePtr v = Expr(*n.a, env);
        bool r = RunTest(n.text, *v);
        return Bool(n.negate ? !r : r);
      }
      case NodeKind::kSelect: {
        ValuePtr test = Expr(*n.b, env);
        return Truthy(*test) ? Expr(*n.a, env) : Undefined();
      }
      case NodeKind::kTernary: return Truthy(*Expr(*n.a, env)) ? Expr(*n.b, env) : Expr(*n.c, env);
      default: throw RenderError("unsupported expression");
    }
  }

 private:
  std::vector<ValuePtr> Arguments(const std::vector<std::unique_ptr<Node>>& nodes, Env& env, bool pack_kwargs,
                                  std::shared_ptr<Object>* kwargs_out = nullptr) {
    std::vector<ValuePtr> positional;
    auto kwargs = std::make_shared<Object>();
    for (const auto& a : nodes) {
      if (a->kind == NodeKind::kSpread) {
        ValuePtr v = Expr(*a->a, env);
        if (!IsArray(*v)) throw RenderError(std::string("cannot unpack non-iterable type: ") + TypeName(*v));
        for (const auto& x : v->items) positional.push_back(x);
      } else if (a->kind != NodeKind::kKeywordArgument && a->kind != NodeKind::kKeywordSpread) {
        positional.push_back(Expr(*a, env));
      }
    }
    for (const auto& a : nodes) {
      if (a->kind == NodeKind::kKeywordArgument) {
        if (kwargs->Get(a->text)) throw RenderError("got multiple values for keyword argument '" + a->text + "'");
        kwargs->Set(a->text, Expr(*a->a, env));
      } else if (a->kind == NodeKind::kKeywordSpread) {
        ValuePtr v = Expr(*a->a, env);
        if (!IsObject(*v)) throw RenderError("argument after ** must be a mapping");
        for (const auto& [k, x] : v->object->entries) kwargs->Set(k, x);
      }
    }
    if (kwargs_out) *kwargs_out = kwargs;
    if (pack_kwargs && !kwargs->entries.empty()) positional.push_back(MakeObject(kwargs, Kind::kKwargs));
    return positional;
  }

  ValuePtr EvalBinary(const Node& n, Env& env) {
    const std::string& op = n.text;
    ValuePtr left = Expr(*n.a, env);
    if (op == "and") return Truthy(*left) ? Expr(*n.b, env) : left;
    if (op == "or") return Truthy(*left) ? left : Expr(*n.b, env);
    ValuePtr right = Expr(*n.b, env);
    if (op == "==") return Bool(LooseEquals(*left, *right));
    if (op == "!=") return Bool(!LooseEquals(*left, *right));
    const Value& l = *left;
    const Value& r = *right;
    if (l.kind == Kind::kUndefined || r.kind == Kind::kUndefined) {
      if (r.kind == Kind::kUndefined && (op == "in" || op == "not in")) return Bool(op == "not in");
      throw RenderError("cannot perform operation " + op + " on undefined values");
    }
    if (l.kind == Kind::kNull || r.kind == Kind::kNull) throw RenderError("cannot perform operation on null values");
    if (op == "~") return Str(RawString(l) + RawString(r));
    bool l_num = IsNumber(l), r_num = IsNumber(r);
    if (op == "**" && (l_num || l.kind == Kind::kBool) && (r_num || r.kind == Kind::kBool)) {
      double a = NumberOf(l), b = NumberOf(r);
      if (a == 0 && b < 0) throw RenderError("0.0 cannot be raised to a negative power");
      double res = std::pow(a, b);
      if (!std::isfinite(res)) throw RenderError("exponentiation result is not a finite real number");
      bool is_float = l.kind == Kind::kFloat || r.kind == Kind::kFloat || b < 0;
      return is_float ? Float(res) : Int(static_cast<int64_t>(res));
    }
    if (l_num && r_num) {
      bool is_float = l.kind == Kind::kFloat || r.kind == Kind::kFloat;
      if (!is_float && (op == "+" || op == "-" || op == "*" || op == "//" || op == "%")) {
        int64_t a = l.integer, b = r.integer;
        if (op == "+") return Int(a + b);
        if (op == "-") return Int(a - b);
        if (op == "*") return Int(a * b);
        if (b == 0) throw RenderError("integer division or modulo by zero");
        if (op == "//") return Int(static_cast<int64_t>(std::floor(static_cast<double>(a) / static_cast<double>(b))));
        return Int(a % b);  // JS's % keeps the sign of the dividend
      }
      double a = NumberOf(l), b = NumberOf(r);
      if (op == "+") return Float(a + b);
      if (op == "-") return Float(a - b);
      if (op == "*") return Float(a * b);
      if (op == "/") return Float(a / b);
      if (op == "//") return Float(std::floor(a / b));
      if (op == "%") return Float(std::fmod(a, b));
      if (op == "<") return Bool(a < b);
      if (op == ">") return Bool(a > b);
      if (op == ">=") return Bool(a >= b);
      if (op == "<=") return Bool(a <= b);
    } else if (IsArray(l) && IsArray(r)) {
      if (op == "+") {
        std::vector<ValuePtr> items = l.items;
        items.insert(items.end(), r.items.begin(), r.items.end());
        return Array(std::move(items));
      }
    } else if (IsArray(r)) {
      bool member = std::any_of(r.items.begin(), r.items.end(), [&](const ValuePtr& x) { return StrictEquals(*x, l); });
      if (op == "in") return Bool(member);
      if (op == "not in") return Bool(!member);
    }
    if ((l.kind == Kind::kString || r.kind == Kind::kString) && op == "+") return Str(RawString(l) + RawString(r));
    if (l.kind == Kind::kString && r.kind == Kind::kString) {
      if (op == "in") return Bool(r.str.find(l.str) != std::string::npos);
      if (op == "not in") return Bool(r.str.find(l.str) == std::string::npos);
      if (op == "<" || op == ">" || op == "<=" || op == ">=") {
        throw RenderError("unknown operator \"" + op + "\" between StringValue and StringValue");
      }
    }
    if (l.kind == Kind::kString && IsObject(r)) {
      if (op == "in") return Bool(r.object->Get(l.str) != nullptr);
      if (op == "not in") return Bool(r.object->Get(l.str) == nullptr);
    }
    throw RenderError("unknown operator \"" + op + "\" between " + TypeName(l) + " and " + TypeName(r));
  }

  ValuePtr StringMethod(const ValuePtr& self, const std::string& name) {
    const std::string s = self->str;
    if (name == "length") return Int(static_cast<int64_t>(Utf16Length(s)));
    if (name == "upper") return Fn([s](auto&, Env&) { return Str(MapCase(s, true)); });
    if (name == "lower") return Fn([s](auto&, Env&) { return Str(MapCase(s, false)); });
    // The reference ignores strip/lstrip/rstrip's `chars` argument and trims whitespace.
    if (name == "strip") return Fn([s](auto&, Env&) { return Str(std::string(TrimEndJs(TrimStartJs(s)))); });
    if (name == "lstrip") return Fn([s](auto&, Env&) { return Str(std::string(TrimStartJs(s))); });
    if (name == "rstrip") return Fn([s](auto&, Env&) { return Str(std::string(TrimEndJs(s))); });
    if (name == "title") return Fn([s](auto&, Env&) { return Str(TitleCase(s)); });
    if (name == "capitalize") {
      return Fn([s](auto&, Env&) {
        if (s.empty()) return Str("");
        size_t i = 0;
        std::string first = s.substr(0, Utf8Length(static_cast<unsigned char>(s[0])));
        i = first.size();
        return Str(MapCase(first, true) + s.substr(i));
      });
    }
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return Fn([s, starts, name](std::vector<ValuePtr>& args, Env&) {
        if (args.empty()) throw RenderError(name + "() requires at least one argument");
        auto test = [&](const std::string& p) {
          return starts ? s.compare(0, p.size(), p) == 0 && s.size() >= p.size()
                        : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        };
        if (args[0]->kind == Kind::kString) return Bool(test(args[0]->str));
        if (IsArray(*args[0])) {
          for (const auto& x : args[0]->items) {
            if (x->kind != Kind::kString) throw RenderError(name + "() tuple elements must be strings");
            if (test(x->str)) return Bool(true);
          }
          return Bool(false);
        }
        throw RenderError(name + "() argument must be a string or tuple of strings");
      });
    }
    if (name == "split") {
      return Fn([s](std::vector<ValuePtr>& args, Env&) {
        ValuePtr sep = args.size() > 0 ? args[0] : Null();
        int64_t maxsplit = args.size() > 1 && args[1]->kind == Kind::kInt ? args[1]->integer : -1;
        std::vector<std::string> parts;
        if (sep->kind == Kind::kNull) {
          std::string_view t = TrimStartJs(s);
          size_t i = 0;
          while (i < t.size()) {
            while (i < t.size() && IsJsWhitespace([&] { size_t j = i; return NextCodePoint(t, &j); }())) {
              size_t j = i;
              NextCodePoint(t, &j);
              i = j;
            }
            if (i >= t.size()) break;
            if (maxsplit != -1 && static_cast<int64_t>(parts.size()) >= maxsplit) {
              parts.emplace_back(t.substr(i));
              break;
            }
            size_t b = i;
            while (i < t.size()) {
              size_t j = i;
              if (IsJsWhitespace(NextCodePoint(t, &j))) break;
              i = j;
            }
            parts.emplace_back(t.substr(b, i - b));
          }
        } else if (sep->kind == Kind::kString) {
          if (sep->str.empty()) throw RenderError("empty separator");
          parts = SplitString(s, sep->str);
          if (maxsplit != -1 && static_cast<int64_t>(parts.size()) > maxsplit) {
            std::string rest;
            for (size_t k = static_cast<size_t>(maxsplit); k < parts.size(); ++k) rest += (k > static_cast<size_t>(maxsplit) ? sep->str : "") + parts[k];
            parts.resize(static_cast<size_t>(maxsplit));
            parts.push_back(rest);
          }
        } else {
          throw RenderError("sep argument must be a string or null");
        }
        std::vector<ValuePtr> items;
        for (auto& p : parts) items.push_back(Str(std::move(p)));
        return Array(std::move(items));
      });
    }
    if (name == "replace") {
      return Fn([s](std::vector<ValuePtr>& args, Env&) {
        if (args.size() < 2 || args[0]->kind != Kind::kString || args[1]->kind != Kind::kString) {
          throw RenderError("replace() arguments must be strings");
        }
        int64_t count = -1;
        if (args.size() > 2) {
          ValuePtr c = args[2]->kind == Kind::kKwargs ? args[2]->object->Get("count") : args[2];
          if (c && c->kind == Kind::kInt) count = c->integer;
          else if (c && c->kind != Kind::kNull) throw RenderError("replace() count argument must be a number or null");
        }
        const std::string& from = args[0]->str;
        const std::string& to = args[1]->str;
        if (count == 0) return Str(s);
        std::string out;
        if (from.empty()) {
          auto cps = CodePoints(s);
          int64_t left = count < 0 ? INT64_MAX : count;
          for (size_t i = 0; i <= cps.size(); ++i) {
            if (left-- > 0) out += to;
            if (i < cps.size()) out += cps[i];
          }
          return Str(out);
        }
        size_t last = 0;
        int64_t left = count < 0 ? INT64_MAX : count;
        for (size_t pos = s.find(from); pos != std::string::npos && left > 0; pos = s.find(from, last), --left) {
          out += s.substr(last, pos - last) + to;
          last = pos + from.size();
        }
        return Str(out + s.substr(last));
      });
    }
    return Undefined();
  }

  ValuePtr ObjectMethod(const ValuePtr& self, const std::string& name) {
    auto obj = self->object;
    if (name == "get") {
      return Fn([obj](std::vector<ValuePtr>& args, Env&) {
        if (args.empty() || args[0]->kind != Kind::kString) throw RenderError("object key must be a string");
        ValuePtr v = obj->Get(args[0]->str);
        return v ? v : (args.size() > 1 ? args[1] : Null());
      });
    }
    if (name == "items") return Fn([self](auto&, Env&) { return Items(*self); });
    if (name == "keys") {
      return Fn([obj](auto&, Env&) {
        std::vector<ValuePtr> items;
        for (const auto& [k, v] : obj->entries) items.push_back(Str(k));
        return Array(std::move(items));
      });
    }
    if (name == "values") {
      return Fn([obj](auto&, Env&) {
        std::vector<ValuePtr> items;
        for (const auto& [k, v] : obj->entries) items.push_back(v);
        return Array(std::move(items));
      });
    }
    return nullptr;
  }

  static ValuePtr Items(const Value& v) {
    std::vector<ValuePtr> items;
    for (const auto& [k, x] : v.object->entries) items.push_back(Array({Str(k), x}));
    return Array(std::move(items));
  }

  ValuePtr EvalMember(const Node& n, Env& env) {
    ValuePtr object = Expr(*n.a, env);
    ValuePtr property;
    if (n.computed) {
      if (n.b->kind == NodeKind::kSlice) return EvalSlice(object, *n.b, env);
      property = Expr(*n.b, env);
    } else if (n.b->kind == NodeKind::kIntegerLiteral) {
      property = Int(n.b->integer);
    } else {
      property = Str(n.b->text);
    }
    ValuePtr value;
    if (IsObject(*object) || object->kind == Kind::kNamespace) {
      if (property->kind != Kind::kString) throw RenderError(std::string("cannot access property with non-string: got ") + TypeName(*property));
      value = object->object->Get(property->str);
      if (!value && object->kind != Kind::kNamespace) value = ObjectMethod(object, property->str);
    } else if (IsArray(*object) || object->kind == Kind::kString) {
      if (property->kind == Kind::kInt) {
        int64_t i = property->integer;
        if (object->kind == Kind::kString) {
          auto cps = CodePoints(object->str);
          int64_t n_cp = static_cast<int64_t>(cps.size());
          if (i < 0) i += n_cp;
          if (i >= 0 && i < n_cp) value = Str(cps[static_cast<size_t>(i)]);
        } else {
          int64_t size = static_cast<int64_t>(object->items.size());
          if (i < 0) i += size;
          if (i >= 0 && i < size) value = object->items[static_cast<size_t>(i)];
        }
      } else if (property->kind == Kind::kString) {
        if (object->kind == Kind::kString) value = StringMethod(object, property->str);
        else if (property->str == "length") value = Int(static_cast<int64_t>(object->items.size()));
      } else {
        throw RenderError(std::string("cannot access property with non-string/non-number: got ") + TypeName(*property));
      }
    } else if (property->kind != Kind::kString) {
      throw RenderError(std::string("cannot access property with non-string: got ") + TypeName(*property));
    }
    return value ? value : Undefined();
  }

  ValuePtr EvalSlice(const ValuePtr& object, const Node& n, Env& env) {
    auto bound = [&](const std::unique_ptr<Node>& e) -> std::optional<int64_t> {
      if (!e) return std::nullopt;
      ValuePtr v = Expr(*e, env);
      if (v->kind == Kind::kUndefined) return std::nullopt;
      if (v->kind != Kind::kInt) throw RenderError("slice indices must be integers");
      return v->integer;
    };
    auto start = bound(n.a), stop = bound(n.b), step = bound(n.c);
    if (IsArray(*object)) return Array(Slice(object->items, start, stop, step.value_or(1)));
    if (object->kind == Kind::kString) {
      std::vector<ValuePtr> chars;
      for (auto& c : CodePoints(object->str)) chars.push_back(Str(std::move(c)));
      std::string out;
      for (const auto& c : Slice(chars, start, stop, step.value_or(1))) out += c->str;
      return Str(out);
    }
    throw RenderError("slice object must be an array or string");
  }

  bool RunTest(const std::string& name, const Value& v) {
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "callable") return v.kind == Kind::kFunction;
    if (name == "odd" || name == "even") {
      if (v.kind != Kind::kInt) throw RenderError("cannot " + name + " on " + TypeName(v));
      return (v.integer % 2 != 0) == (name == "odd");
    }
    if (name == "false") return v.kind == Kind::kBool && !v.boolean;
    if (name == "true") return v.kind == Kind::kBool && v.boolean;
    if (name == "none") return v.kind == Kind::kNull;
    if (name == "string") return v.kind == Kind::kString;
    if (name == "number") return IsNumber(v);
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "iterable") return v.kind == Kind::kArray || v.kind == Kind::kString;  // not tuples, as the reference
    if (name == "mapping") return IsObject(v);
    if (name == "sequence") return IsArray(v) || IsObject(v) || v.kind == Kind::kString;
    if (name == "lower") return v.kind == Kind::kString && v.str == MapCase(v.str, false);
    if (name == "upper") return v.kind == Kind::kString && v.str == MapCase(v.str, true);
    if (name == "defined") return v.kind != Kind::kUndefined;
    if (name == "undefined") return v.kind == Kind::kUndefined;
    throw RenderError("unknown test: " + name);
  }

  ValuePtr ApplyFilter(const ValuePtr& operand, const Node& filter, Env& env) {
    if (filter.kind == NodeKind::kIdentifier) return SimpleFilter(operand, filter.text, env);
    if (filter.kind != NodeKind::kCall || filter.a->kind != NodeKind::kIdentifier) throw RenderError("unknown filter");
    const std::string& name = filter.a->text;
    std::shared_ptr<Object> kwargs;
    std::vector<ValuePtr> args = Arguments(filter.args, env, false, &kwargs);
    auto arg = [&](size_t i, const char* key) -> ValuePtr {
      if (i < args.size()) return args[i];
      return kwargs->Get(key);
    };
    const Value& v = *operand;
    if (name == "tojson") {
      JsonOptions o;
      if (ValuePtr x = kwargs->Get("indent"); x && x->kind != Kind::kNull) {
        if (x->kind != Kind::kInt) throw RenderError("if set, indent must be a number");
        o.indent = x->integer;
      }
      if (ValuePtr x = kwargs->Get("ensure_ascii")) o.ensure_ascii = Truthy(*x);
      if (ValuePtr x = kwargs->Get("sort_keys")) o.sort_keys = Truthy(*x);
      if (ValuePtr x = kwargs->Get("separators"); x && IsArray(*x) && x->items.size() == 2) {
        o.separators = std::make_pair(x->items[0]->str, x->items[1]->str);
      }
      return Str(ToJson(v, o, 0, true));
    }
    if (name == "join") {
      std::vector<std::string> parts;
      if (v.kind == Kind::kString) parts = CodePoints(v.str);
      else if (IsArray(v)) for (const auto& x : v.items) parts.push_back(x->kind == Kind::kString ? x->str : RawString(*x));
      else throw RenderError(std::string("cannot apply filter \"join\" to type: ") + TypeName(v));
      ValuePtr sep = arg(0, "separator");
      std::string sep_s = sep ? sep->str : "";
      std::string out;
      for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep_s : "") + parts[i];
      return Str(out);
    }
    if (name == "default") {
      ValuePtr dflt = args.size() > 0 ? args[0] : Str("");
      ValuePtr boolean = arg(1, "boolean");
      bool b = boolean && Truthy(*boolean);
      if (v.kind == Kind::kUndefined || (b && !Truthy(v))) return dflt;
      return operand;
    }
    if (name == "indent" && v.kind == Kind::kString) {
      ValuePtr width = arg(0, "width");
      ValuePtr first = arg(1, "first");
      ValuePtr blank = arg(2, "blank");
      std::string pad(static_cast<size_t>(width && width->kind == Kind::kInt ? width->integer : 4), ' ');
      auto lines = SplitString(v.str, "\n");
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) {
        bool keep = (!(first && Truthy(*first)) && i == 0) || (!(blank && Truthy(*blank)) && lines[i].empty());
        out += (i ? "\n" : "") + (keep ? lines[i] : pad + lines[i]);
      }
      return Str(out);
    }
    if (name == "replace" && v.kind == Kind::kString) {
      ValuePtr fn = StringMethod(operand, "replace");
      std::vector<ValuePtr> all = args;
      all.push_back(MakeObject(kwargs, Kind::kKwargs));
      return fn->fn(all, env);
    }
    if (name == "map" && IsArray(v)) {
      ValuePtr attr = kwargs->Get("attribute");
      if (!attr || attr->kind != Kind::kString) throw RenderError("`map` expressions without `attribute` set are not supported");
      std::vector<ValuePtr> out;
      for (const auto& x : v.items) {
        if (!IsObject(*x) && x->kind != Kind::kNamespace) throw RenderError("items in map must be an object");
        ValuePtr got = x->object->Get(attr->str);
        ValuePtr dflt = kwargs->Get("default");
        out.push_back(got ? got : (dflt ? dflt : Undefined()));
      }
      return Array(std::move(out));
    }
    if ((name == "selectattr" || name == "rejectattr") && IsArray(v)) {
      bool select = name == "selectattr";
      if (args.empty() || args[0]->kind != Kind::kString) throw RenderError("arguments of `" + name + "` must be strings");
      std::vector<ValuePtr> out;
      for (const auto& x : v.items) {
        if (!IsObject(*x) && x->kind != Kind::kNamespace) throw RenderError("`" + name + "` can only be applied to array of objects");
        ValuePtr a = x->object->Get(args[0]->str);
        bool result = false;
        if (a && Truthy(*a)) {
          result = args.size() > 1 ? RunTestWith(args[1]->str, *a, args.size() > 2 ? args[2].get() : nullptr) : Truthy(*a);
        }
        if (result == select) out.push_back(x);
      }
      return Array(std::move(out));
    }
    if (IsObject(v)) {
      if (ValuePtr m = ObjectMethod(operand, name)) {
        std::vector<ValuePtr> all = args;
        if (!kwargs->entries.empty()) all.push_back(MakeObject(kwargs, Kind::kKwargs));
        return m->fn(all, env);
      }
    }
    throw RenderError("unsupported filter: " + name + "(...) on " + TypeName(v));
  }

  bool RunTestWith(const std::string& name, const Value& v, const Value* other) {
    if ((name == "equalto" || name == "eq") && other) return StrictEquals(v, *other);
    return RunTest(name, v);
  }

  ValuePtr SimpleFilter(const ValuePtr& operand, const std::string& name, Env& env) {
    const Value& v = *operand;
    if (name == "safe") return operand;
    if (name == "tojson") return Str(ToJson(v, {}, 0, true));
    if (IsArray(v)) {
      if (name == "list") return operand;
      if (name == "first") return v.items.empty() ? Undefined() : v.items.front();
      if (name == "last") return v.items.empty() ? Undefined() : v.items.back();
      if (name == "length") return Int(static_cast<int64_t>(v.items.size()));
      if (name == "reverse") return Array(std::vector<ValuePtr>(v.items.rbegin(), v.items.rend()));
      if (name == "join") {
        std::string out;
        for (const auto& x : v.items) out += x->kind == Kind::kString ? x->str : RawString(*x);
        return Str(out);
      }
      if (name == "string") return Str(ToJson(v, {}, 0, false));
      throw RenderError("unsupported filter for a list: " + name);
    }
    if (v.kind == Kind::kString) {
      if (name == "length") return Int(static_cast<int64_t>(Utf16Length(v.str)));
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
        std::vector<ValuePtr> none;
        return StringMethod(operand, name)->fn(none, env);
      }
      if (name == "trim") return Str(std::string(TrimEndJs(TrimStartJs(v.str))));
      if (name == "indent") {
        auto lines = SplitString(v.str, "\n");
        std::string out;
        for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + ((i == 0 || lines[i].empty()) ? lines[i] : "    " + lines[i]);
        return Str(out);
      }
      if (name == "join" || name == "string") return operand;
      if (name == "int") {
        char* end = nullptr;
        long long x = std::strtoll(std::string(TrimStartJs(v.str)).c_str(), &end, 10);
        return Int(x);
      }
      if (name == "float") return Float(std::strtod(std::string(TrimStartJs(v.str)).c_str(), nullptr));
      throw RenderError("unsupported filter for a string: " + name);
    }
    if (IsNumber(v)) {
      if (name == "abs") return v.kind == Kind::kInt ? Int(std::llabs(v.integer)) : Float(std::fabs(v.number));
      if (name == "int") return Int(static_cast<int64_t>(std::floor(NumberOf(v))));
      if (name == "float") return Float(NumberOf(v));
      if (name == "string") return Str(Display(v));
      throw RenderError("unsupported filter for a number: " + name);
    }
    if (IsObject(v)) {
      if (name == "items") return Items(v);
      if (name == "length") return Int(static_cast<int64_t>(v.object->entries.size()));
      if (ValuePtr m = ObjectMethod(operand, name)) {
        std::vector<ValuePtr> none;
        return m->fn(none, env);
      }
      throw RenderError("unsupported filter for a mapping: " + name);
    }
    if (v.kind == Kind::kBool) {
      if (name == "bool") return Bool(v.boolean);
      if (name == "int") return Int(v.boolean ? 1 : 0);
      if (name == "float") return Float(v.boolean ? 1 : 0);
      if (name == "string") return Str(v.boolean ? "true" : "false");
    }
    throw RenderError("cannot apply filter \"" + name + "\" to type: " + TypeName(v));
  }

  void Assign(const Node& target, const ValuePtr& value, Env& env) {
    if (target.kind == NodeKind::kIdentifier) {
      env.Set(target.text, value);
    } else if (target.kind == NodeKind::kTupleLiteral) {
      if (!IsArray(*value)) throw RenderError(std::string("cannot unpack non-iterable type: ") + TypeName(*value));
      if (value->items.size() != target.args.size()) throw RenderError("wrong number of items to unpack");
      for (size_t i = 0; i < target.args.size(); ++i) {
        if (target.args[i]->kind != NodeKind::kIdentifier) throw RenderError("cannot unpack to a non-identifier");
        env.Set(target.args[i]->text, value->items[i]);
      }
    } else if (target.kind == NodeKind::kMember) {
      ValuePtr object = Expr(*target.a, env);
      if (object->kind != Kind::kNamespace) throw RenderError("cannot assign attribute on non-namespace object");
      if (target.b->kind != NodeKind::kIdentifier) throw RenderError("cannot assign to member with non-identifier property");
      object->object->Set(target.b->text, value);
    } else {
      throw RenderError("invalid left-hand side of set");
    }
  }

  ValuePtr EvalSet(const Node& n, Env& env, Flow* flow) {
    ValuePtr value;
    if (n.b) {
      value = Expr(*n.b, env);
    } else {
      Flow inner = Flow::kNormal;
      value = Str(Block(n.body, env, &inner));
    }
    Assign(*n.a, value, env);
    return Null();
  }

  ValuePtr EvalFor(const Node& n, Env& env) {
    Env scope(&env);
    const Node* test = nullptr;
    ValuePtr iterable;
    if (n.b->kind == NodeKind::kSelect) {
      iterable = Expr(*n.b->a, scope);
      test = n.b->b.get();
    } else {
      iterable = Expr(*n.b, scope);
    }
    std::vector<ValuePtr> source;
    if (IsArray(*iterable)) {
      source = iterable->items;
    } else if (IsObject(*iterable)) {
      for (const auto& [k, v] : iterable->object->entries) source.push_back(Str(k));
    } else {
      throw RenderError(std::string("expected iterable or object type in for loop: got ") + TypeName(*iterable));
    }
    std::vector<ValuePtr> items;
    for (const auto& current : source) {
      if (test) {
        Env loop_scope(&scope);
        Assign(*n.a, current, loop_scope);
        if (!Truthy(*Expr(*test, loop_scope))) continue;
      }
      items.push_back(current);
    }
    std::string out;
    bool no_iteration = true;
    for (size_t i = 0; i < items.size(); ++i) {
      auto loop = std::make_shared<Object>();
      int64_t len = static_cast<int64_t>(items.size()), idx = static_cast<int64_t>(i);
      loop->Set("index", Int(idx + 1));
      loop->Set("index0", Int(idx));
      loop->Set("revindex", Int(len - idx));
      loop->Set("revindex0", Int(len - idx - 1));
      loop->Set("first", Bool(i == 0));
      loop->Set("last", Bool(i + 1 == items.size()));
      loop->Set("length", Int(len));
      loop->Set("previtem", i > 0 ? items[i - 1] : Undefined());
      loop->Set("nextitem", i + 1 < items.size() ? items[i + 1] : Undefined());
      scope.Set("loop", MakeObject(loop));
      Assign(*n.a, items[i], scope);
      Flow flow = Flow::kNormal;
      out += Block(n.body, scope, &flow);
      if (flow == Flow::kContinue) continue;
      if (flow == Flow::kBreak) break;
      no_iteration = false;
    }
    if (no_iteration) {
      Flow flow = Flow::kNormal;
      out += Block(n.alternate, scope, &flow);
    }
    return Str(out);
  }

  // Binds a macro's (or caller's) parameters in `scope`.
  void BindArguments(const std::vector<std::unique_ptr<Node>>& params, std::vector<ValuePtr> args, Env& scope) {
    auto kwargs = std::make_shared<Object>();
    if (!args.empty() && args.back()->kind == Kind::kKwargs) {
      kwargs->entries = args.back()->object->entries;
      args.pop_back();
    }
    std::vector<std::pair<std::string, const Node*>> pending;
    for (size_t i = 0; i < params.size(); ++i) {
      const Node& p = *params[i];
      std::string name = p.kind == NodeKind::kIdentifier ? p.text : p.text;
      ValuePtr value = i < args.size() ? args[i] : nullptr;
      if (!value) {
        if (ValuePtr kw = kwargs->Get(name)) {
          value = kw;
          auto& e = kwargs->entries;
          e.erase(std::remove_if(e.begin(), e.end(), [&](const auto& x) { return x.first == name; }), e.end());
        }
      }
      if (!value && p.kind == NodeKind::kKeywordArgument) pending.emplace_back(name, p.a.get());
      scope.Set(name, value ? value : Undefined());
    }
    scope.Set("kwargs", MakeObject(kwargs));
    std::vector<ValuePtr> varargs;
    for (size_t i = params.size(); i < args.size(); ++i) varargs.push_back(args[i]);
    scope.Set("varargs", Array(std::move(varargs)));
    for (const auto& [name, dflt] : pending) scope.Set(name, Expr(*dflt, scope));
  }

  // Counts macro call nesting for as long as it lives.
  struct CallDepth {
    explicit CallDepth(int* d) : d_(d) {
      if (++*d_ > config::kMaxCallDepth) throw RenderError("macro calls nest deeper than " + std::to_string(config::kMaxCallDepth));
    }
    ~CallDepth() { --*d_; }
    int* d_;
  };
  int call_depth_ = 0;

  ValuePtr EvalMacro(const Node& n, Env& env) {
    const Node* node = &n;
    env.Set(n.text, Fn([this, node](std::vector<ValuePtr>& args, Env& caller) {
              CallDepth depth(&call_depth_);
              Env scope(&caller);
              BindArguments(node->args, args, scope);
              Flow flow = Flow::kNormal;
              return Str(Block(node->body, scope, &flow));
            }));
    return Null();
  }

  ValuePtr EvalCallStatement(const Node& n, Env& env) {
    const Node* node = &n;
    Env* defining = &env;
    ValuePtr caller = Fn([this, node, defining](std::vector<ValuePtr>& args, Env&) {
      CallDepth depth(&call_depth_);
      Env scope(defining);
      BindArguments(node->args, args, scope);
      Flow flow = Flow::kNormal;
      return Str(Block(node->body, scope, &flow));
    });
    std::shared_ptr<Object> kwargs;
    std::vector<ValuePtr> args = Arguments(n.a->args, env, false, &kwargs);
    args.push_back(MakeObject(kwargs, Kind::kKwargs));
    ValuePtr fn = Expr(*n.a->a, env);
    if (fn->kind != Kind::kFunction) throw RenderError("cannot call something that is not a function");
    Env with_caller(&env);
    with_caller.Set("caller", caller);
    return fn->fn(args, with_caller);
  }
};

void SetupGlobals(Env& env) {
  env.Set("namespace", Fn([](std::vector<ValuePtr>& args, Env&) {
            auto o = std::make_shared<Object>();
            std::vector<ValuePtr> positional = args;
            ValuePtr kwargs;
            if (!positional.empty() && positional.back()->kind == Kind::kKwargs) {
              kwargs = positional.back();
              positional.pop_back();
            }
            if (positional.size() > 1) throw RenderError("namespace expected at most 1 argument");
            if (positional.size() == 1) {
              if (IsObject(*positional[0])) {
                for (const auto& [k, v] : positional[0]->object->entries) o->Set(k, v);
              } else {
                throw RenderError("namespace expects a mapping");
              }
            }
            if (kwargs) {
              for (const auto& [k, v] : kwargs->object->entries) o->Set(k, v);
            }
            return MakeObject(o, Kind::kNamespace);
          }));
  env.Set("false", Bool(false));
  env.Set("true", Bool(true));
  env.Set("none", Null());
  env.Set("raise_exception", Fn([](std::vector<ValuePtr>& args, Env&) -> ValuePtr {
            throw RenderError(args.empty() ? "raise_exception" : (args[0]->kind == Kind::kString ? args[0]->str : Display(*args[0])));
          }));
  env.Set("range", Fn([](std::vector<ValuePtr>& args, Env&) {
            if (args.empty() || args[0]->kind != Kind::kInt) throw RenderError("range() needs integers");
            int64_t start = 0, stop = args[0]->integer, step = 1;
            if (args.size() > 1 && args[1]->kind == Kind::kInt) {
              start = args[0]->integer;
              stop = args[1]->integer;
            }
            if (args.size() > 2 && args[2]->kind == Kind::kInt) step = args[2]->integer;
            if (step == 0) throw RenderError("range() step must not be zero");
            std::vector<ValuePtr> out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
              if (out.size() >= config::kMaxRange) throw RenderError("range() is longer than the limit");
              out.push_back(Int(i));
            }
            return Array(std::move(out));
          }));
  env.Set("strftime_now", Fn([](std::vector<ValuePtr>& args, Env&) {
            if (args.empty() || args[0]->kind != Kind::kString) throw RenderError("strftime_now() needs a format string");
            return Str(StrftimeNow(args[0]->str));
          }));
  env.Set("True", Bool(true));
  env.Set("False", Bool(false));
  env.Set("None", Null());
}

}  // namespace

Template::Template() = default;
Template::~Template() = default;

Result<std::shared_ptr<const Template>> Template::Parse(std::string_view source) {
  KVF_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Node> root, jinja::Parse(tokens));
  std::shared_ptr<Template> t(new Template());
  t->root_ = std::move(root);
  return std::shared_ptr<const Template>(std::move(t));
}

Result<std::string> Template::Render(const json& context) const {
  if (!context.is_object()) return InvalidArgument("jinja: the render context must be a JSON object");
  try {
    Env globals;
    SetupGlobals(globals);
    for (auto it = context.begin(); it != context.end(); ++it) globals.Set(it.key(), FromJson(it.value()));
    Interpreter interpreter;
    Flow flow = Flow::kNormal;
    return interpreter.Block(root_->body, globals, &flow);
  } catch (const RenderError& e) {
    return InvalidArgument(std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {
    return Internal(std::string("chat template: ") + e.what());
  }
}

}  // namespace kvfleet::tok::jinja
