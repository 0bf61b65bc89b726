// The Jinja interpreter's expressions: literals, variables, calls and their arguments
// (*args, **kwargs), member access and slicing, and the operators with the semantics of
// the reference (@huggingface/jinja, which runs on JavaScript): `%` keeps the dividend's
// sign, `in` on a list compares strictly.
#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_value.h"

namespace kvfleet::tok::jinja {

ValuePtr Interpreter::Expr(const Node& n, Env& env) {
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
        return Int(CheckedMul(static_cast<int64_t>(sign), v->kind == Kind::kBool ? (v->boolean ? 1 : 0) : v->integer));
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

std::vector<ValuePtr> Interpreter::Arguments(const std::vector<std::unique_ptr<Node>>& nodes, Env& env, bool pack_kwargs,
                                             std::shared_ptr<Object>* kwargs_out) {
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

namespace {

// A value built by repeated doubling (`{% set ns.s = ns.s ~ ns.s %}` in a loop) would
// exhaust memory long before the output limit is checked.
constexpr size_t kMaxValueBytes = 64 << 20;

ValuePtr Concat(std::string a, const std::string& b) {
  if (a.size() + b.size() > kMaxValueBytes) throw RenderError("a string exceeds the limit");
  return Str(std::move(a) + b);
}

}  // namespace

ValuePtr Interpreter::EvalBinary(const Node& n, Env& env) {
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
  if (op == "~") return Concat(RawString(l), RawString(r));
  bool l_num = IsNumber(l), r_num = IsNumber(r);
  if (op == "**" && (l_num || l.kind == Kind::kBool) && (r_num || r.kind == Kind::kBool)) {
    double a = NumberOf(l), b = NumberOf(r);
    if (a == 0 && b < 0) throw RenderError("0.0 cannot be raised to a negative power");
    double res = std::pow(a, b);
    if (!std::isfinite(res)) throw RenderError("exponentiation result is not a finite real number");
    bool is_float = l.kind == Kind::kFloat || r.kind == Kind::kFloat || b < 0;
    return is_float ? Float(res) : Int(IntFromFloat(res));
  }
  if (l_num && r_num) {
    bool is_float = l.kind == Kind::kFloat || r.kind == Kind::kFloat;
    if (!is_float && (op == "+" || op == "-" || op == "*" || op == "//" || op == "%")) {
      int64_t a = l.integer, b = r.integer;
      if (op == "+") return Int(CheckedAdd(a, b));
      if (op == "-") return Int(CheckedSub(a, b));
      if (op == "*") return Int(CheckedMul(a, b));
      if (b == 0) throw RenderError("integer division or modulo by zero");
      if (op == "//") return Int(IntFromFloat(std::floor(static_cast<double>(a) / static_cast<double>(b))));
      return Int(b == -1 ? 0 : a % b);  // JS's % keeps the sign of the dividend; INT64_MIN % -1 traps
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
      if (l.items.size() + r.items.size() > kMaxValueBytes / sizeof(ValuePtr)) throw RenderError("a list exceeds the limit");
      std::vector<ValuePtr> items = l.items;
      items.insert(items.end(), r.items.begin(), r.items.end());
      return Array(std::move(items));
    }
  } else if (IsArray(r)) {
    bool member = std::any_of(r.items.begin(), r.items.end(), [&](const ValuePtr& x) { return StrictEquals(*x, l); });
    if (op == "in") return Bool(member);
    if (op == "not in") return Bool(!member);
  }
  if ((l.kind == Kind::kString || r.kind == Kind::kString) && op == "+") return Concat(RawString(l), RawString(r));
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

ValuePtr Interpreter::EvalMember(const Node& n, Env& env) {
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

ValuePtr Interpreter::EvalSlice(const ValuePtr& object, const Node& n, Env& env) {
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

}  // namespace kvfleet::tok::jinja
