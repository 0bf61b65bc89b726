// The Jinja interpreter's statements: blocks and their output limit, if, for (with
// loop.*), set, macro and call with their argument binding, filter blocks, and the
// globals (range, namespace, raise_exception, strftime_now); then Template::Parse and
// Render. Like jinja_expr.cc and jinja_filters.cc it follows @huggingface/jinja's
// runtime.ts (including its departures from Python Jinja, e.g. str.strip(chars) ignoring
// `chars`), so renders agree byte for byte.
#include <algorithm>
#include <stdexcept>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_internal.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_value.h"

namespace kvfleet::tok::jinja {

namespace {

namespace config {
// Macro calls nest at most this deep (recursive macros would otherwise exhaust the stack).
constexpr int kMaxCallDepth = 64;
// A render producing more than this is stopped (loops over huge ranges, exponential macros).
constexpr size_t kMaxOutputBytes = 64 << 20;
// range() longer than this is refused.
constexpr size_t kMaxRange = 1 << 20;
}  // namespace config

}  // namespace

std::string Interpreter::Block(const std::vector<std::unique_ptr<Node>>& body, Env& env, Flow* flow) {
  std::string out;
  for (const auto& s : body) {
    ValuePtr v = Eval(*s, env, flow);
    if (v->kind != Kind::kNull && v->kind != Kind::kUndefined) out += Display(*v);
    if (out.size() > config::kMaxOutputBytes) throw RenderError("the template's output exceeds the limit");
    if (*flow != Flow::kNormal) break;
  }
  return out;
}

ValuePtr Interpreter::Eval(const Node& n, Env& env, Flow* flow) {
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

void Interpreter::Assign(const Node& target, const ValuePtr& value, Env& env) {
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

ValuePtr Interpreter::EvalSet(const Node& n, Env& env, Flow* flow) {
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

ValuePtr Interpreter::EvalFor(const Node& n, Env& env) {
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
void Interpreter::BindArguments(const std::vector<std::unique_ptr<Node>>& params, std::vector<ValuePtr> args, Env& scope) {
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
struct Interpreter::CallDepth {
  explicit CallDepth(int* d) : d_(d) {
    if (++*d_ > config::kMaxCallDepth) throw RenderError("macro calls nest deeper than " + std::to_string(config::kMaxCallDepth));
  }
  ~CallDepth() { --*d_; }
  int* d_;
};

ValuePtr Interpreter::EvalMacro(const Node& n, Env& env) {
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

ValuePtr Interpreter::EvalCallStatement(const Node& n, Env& env) {
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

namespace {

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
            for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
              if (out.size() >= config::kMaxRange) throw RenderError("range() is longer than the limit");
              out.push_back(Int(i));
              if (__builtin_add_overflow(i, step, &i)) break;  // past the end either way
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
