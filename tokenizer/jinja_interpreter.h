// The Jinja interpreter's state: variable scopes (Env) and the tree walker that renders
// a parsed template (Interpreter). Its definitions are split by what they evaluate:
// statements in jinja_render.cc, expressions in jinja_expr.cc, filters, tests and methods
// in jinja_filters.cc. Only those three include this.
//
// Thread safety: thread-compatible; one Interpreter and its Envs live in one Render call.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/jinja_value.h"

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

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  // Statements (jinja_render.cc).
  std::string Block(const std::vector<std::unique_ptr<Node>>& body, Env& env, Flow* flow);
  ValuePtr Eval(const Node& n, Env& env, Flow* flow);
  // Expressions (jinja_expr.cc).
  ValuePtr Expr(const Node& n, Env& env);

 private:
  // Statements (jinja_render.cc).
  void Assign(const Node& target, const ValuePtr& value, Env& env);
  ValuePtr EvalSet(const Node& n, Env& env, Flow* flow);
  ValuePtr EvalFor(const Node& n, Env& env);
  void BindArguments(const std::vector<std::unique_ptr<Node>>& params, std::vector<ValuePtr> args, Env& scope);
  ValuePtr EvalMacro(const Node& n, Env& env);
  ValuePtr EvalCallStatement(const Node& n, Env& env);

  // Expressions (jinja_expr.cc).
  std::vector<ValuePtr> Arguments(const std::vector<std::unique_ptr<Node>>& nodes, Env& env, bool pack_kwargs,
                                  std::shared_ptr<Object>* kwargs_out = nullptr);
  ValuePtr EvalBinary(const Node& n, Env& env);
  ValuePtr EvalMember(const Node& n, Env& env);
  ValuePtr EvalSlice(const ValuePtr& object, const Node& n, Env& env);

  // Filters, tests and methods (jinja_filters.cc).
  ValuePtr ApplyFilter(const ValuePtr& operand, const Node& filter, Env& env);
  ValuePtr SimpleFilter(const ValuePtr& operand, const std::string& name, Env& env);
  bool RunTest(const std::string& name, const Value& v);
  bool RunTestWith(const std::string& name, const Value& v, const Value* other);
  ValuePtr StringMethod(const ValuePtr& self, const std::string& name);
  ValuePtr ObjectMethod(const ValuePtr& self, const std::string& name);
  static ValuePtr Items(const Value& v);

  struct CallDepth;  // macro call nesting (jinja_render.cc)
  int call_depth_ = 0;
};

}  // namespace kvfleet::tok::jinja
