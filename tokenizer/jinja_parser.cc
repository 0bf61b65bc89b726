// The Jinja parser, following @huggingface/jinja's parser.ts rule for rule (statements,
// operator precedence, slices, keyword arguments), so that a template parses the same way
// there and here.
#include <cerrno>
#include <stdexcept>

#include "tokenizer/jinja_internal.h"

namespace kvfleet::tok::jinja {

namespace {

// Parse errors travel as exceptions inside this file and become a Status at its edge.
struct SyntaxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using NodePtr = std::unique_ptr<Node>;

namespace config {
// Nesting deeper than this is refused, so hostile templates cannot exhaust the stack.
constexpr int kMaxNesting = 256;
}  // namespace config

NodePtr Make(NodeKind k) { return std::make_unique<Node>(k); }

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  NodePtr Program() {
    NodePtr program = Make(NodeKind::kProgram);
    while (cur_ < t_.size()) program->body.push_back(Any());
    return program;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    if (cur_ + ahead >= t_.size()) throw SyntaxError("unexpected end of template");
    return t_[cur_ + ahead];
  }
  bool Is(TokenType type) const { return cur_ < t_.size() && t_[cur_].type == type; }
  bool IsIdentifier(std::string_view name, size_t ahead = 0) const {
    return cur_ + ahead < t_.size() && t_[cur_ + ahead].type == TokenType::kIdentifier && t_[cur_ + ahead].value == name;
  }
  bool IsStatement(std::initializer_list<std::string_view> names) const {
    if (!(cur_ + 1 < t_.size() && t_[cur_].type == TokenType::kOpenStatement && t_[cur_ + 1].type == TokenType::kIdentifier)) {
      return false;
    }
    for (auto n : names) {
      if (t_[cur_ + 1].value == n) return true;
    }
    return false;
  }
  const Token& Expect(TokenType type, const char* what) {
    if (cur_ >= t_.size() || t_[cur_].type != type) throw SyntaxError(std::string("expected ") + what);
    return t_[cur_++];
  }
  void ExpectIdentifier(std::string_view name) {
    if (!IsIdentifier(name)) throw SyntaxError("expected " + std::string(name));
    ++cur_;
  }
  // Parses statements until one of `ends` ({% end... %}), which is left unconsumed.
  void Until(std::initializer_list<std::string_view> ends, std::vector<NodePtr>* out) {
    while (!IsStatement(ends)) {
      if (cur_ >= t_.size()) throw SyntaxError("missing {% " + std::string(*ends.begin()) + " %}");
      out->push_back(Any());
    }
  }
  void End(std::string_view name) {
    Expect(TokenType::kOpenStatement, "{%");
    ExpectIdentifier(name);
    Expect(TokenType::kCloseStatement, "%}");
  }

  // Counts nesting for as long as it lives.
  struct Depth {
    explicit Depth(int* d) : d_(d) {
      if (++*d_ > config::kMaxNesting) throw SyntaxError("template nests deeper than " + std::to_string(config::kMaxNesting));
    }
    ~Depth() { --*d_; }
    int* d_;
  };

  NodePtr Any() {
    Depth depth(&depth_);
    const Token& tok = Peek();
    switch (tok.type) {
      case TokenType::kComment: {
        ++cur_;
        NodePtr n = Make(NodeKind::kComment);
        n->text = tok.value;
        return n;
      }
      case TokenType::kText: {
        ++cur_;
        NodePtr n = Make(NodeKind::kStringLiteral);
        n->text = tok.value;
        return n;
      }
      case TokenType::kOpenStatement:
        return Statement();
      case TokenType::kOpenExpression: {
        ++cur_;
        NodePtr e = Expression();
        Expect(TokenType::kCloseExpression, "}}");
        return e;
      }
      default:
        throw SyntaxError("unexpected token '" + tok.value + "'");
    }
  }

  NodePtr Statement() {
    Expect(TokenType::kOpenStatement, "{%");
    if (!Is(TokenType::kIdentifier)) throw SyntaxError("unknown statement");
    std::string name = Peek().value;
    ++cur_;
    if (name == "set") return Set();
    if (name == "if") {
      NodePtr n = If();
      End("endif");
      return n;
    }
    if (name == "for") {
      NodePtr n = For();
      End("endfor");
      return n;
    }
    if (name == "macro") {
      NodePtr n = Make(NodeKind::kMacro);
      NodePtr id = Primary();
      if (id->kind != NodeKind::kIdentifier) throw SyntaxError("expected identifier following macro");
      n->text = id->text;
      n->args = Args(true);
      Expect(TokenType::kCloseStatement, "%}");
      Until({"endmacro"}, &n->body);
      End("endmacro");
      return n;
    }
    if (name == "call") {
      NodePtr n = Make(NodeKind::kCallStatement);
      if (Is(TokenType::kOpenParen)) {
        n->args = Args(true);
        n->has_caller_args = true;
      }
      NodePtr callee = Primary();
      if (callee->kind != NodeKind::kIdentifier) throw SyntaxError("expected identifier following call");
      NodePtr call = Make(NodeKind::kCall);
      call->a = std::move(callee);
      call->args = Args(false);
      n->a = std::move(call);
      Expect(TokenType::kCloseStatement, "%}");
      Until({"endcall"}, &n->body);
      End("endcall");
      return n;
    }
    if (name == "break" || name == "continue") {
      Expect(TokenType::kCloseStatement, "%}");
      return Make(name == "break" ? NodeKind::kBreak : NodeKind::kContinue);
    }
    if (name == "filter") {
      NodePtr n = Make(NodeKind::kFilterStatement);
      NodePtr f = Primary();
      if (f->kind == NodeKind::kIdentifier && Is(TokenType::kOpenParen)) f = Call(std::move(f));
      n->a = std::move(f);
      Expect(TokenType::kCloseStatement, "%}");
      Until({"endfilter"}, &n->body);
      End("endfilter");
      return n;
    }
    throw SyntaxError("unsupported statement '" + name + "'");
  }

  NodePtr Set() {
    NodePtr n = Make(NodeKind::kSet);
    n->a = Sequence(false);
    if (Is(TokenType::kEquals)) {
      ++cur_;
      n->b = Sequence(false);
    } else {
      Expect(TokenType::kCloseStatement, "%}");
      Until({"endset"}, &n->body);
      Expect(TokenType::kOpenStatement, "{%");
      ExpectIdentifier("endset");
    }
    Expect(TokenType::kCloseStatement, "%}");
    return n;
  }

  NodePtr If() {
    NodePtr n = Make(NodeKind::kIf);
    n->a = Expression();
    Expect(TokenType::kCloseStatement, "%}");
    Until({"elif", "else", "endif"}, &n->body);
    if (IsStatement({"elif"})) {
      cur_ += 2;
      n->alternate.push_back(If());
    } else if (IsStatement({"else"})) {
      cur_ += 2;
      Expect(TokenType::kCloseStatement, "%}");
      Until({"endif"}, &n->alternate);
    }
    return n;
  }

  NodePtr For() {
    NodePtr n = Make(NodeKind::kFor);
    n->a = Sequence(true);
    if (n->a->kind != NodeKind::kIdentifier && n->a->kind != NodeKind::kTupleLiteral) {
      throw SyntaxError("expected identifier or tuple for the loop variable");
    }
    if (!IsIdentifier("in")) throw SyntaxError("expected 'in' after the loop variable");
    ++cur_;
    n->b = Expression();
    Expect(TokenType::kCloseStatement, "%}");
    Until({"endfor", "else"}, &n->body);
    if (IsStatement({"else"})) {
      cur_ += 2;
      Expect(TokenType::kCloseStatement, "%}");
      Until({"endfor"}, &n->alternate);
    }
    return n;
  }

  NodePtr Sequence(bool primary) {
    std::vector<NodePtr> items;
    items.push_back(primary ? Primary() : Expression());
    bool tuple = Is(TokenType::kComma);
    while (tuple) {
      ++cur_;
      items.push_back(primary ? Primary() : Expression());
      if (!Is(TokenType::kComma)) break;
    }
    if (!tuple) return std::move(items[0]);
    NodePtr t = Make(NodeKind::kTupleLiteral);
    t->args = std::move(items);
    return t;
  }

  NodePtr Expression() {
    Depth depth(&depth_);
    return IfExpression();
  }

  NodePtr IfExpression() {
    NodePtr a = Or();
    if (IsIdentifier("if")) {
      ++cur_;
      NodePtr test = Or();
      if (IsIdentifier("else")) {
        ++cur_;
        NodePtr n = Make(NodeKind::kTernary);
        n->a = std::move(test);
        n->b = std::move(a);
        n->c = IfExpression();
        return n;
      }
      NodePtr n = Make(NodeKind::kSelect);
      n->a = std::move(a);
      n->b = std::move(test);
      return n;
    }
    return a;
  }

  NodePtr Binary(std::string op, NodePtr l, NodePtr r) {
    NodePtr n = Make(NodeKind::kBinary);
    n->text = std::move(op);
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  NodePtr Or() {
    NodePtr left = And();
    while (IsIdentifier("or")) {
      ++cur_;
      left = Binary("or", std::move(left), And());
    }
    return left;
  }
  NodePtr And() {
    NodePtr left = Not();
    while (IsIdentifier("and")) {
      ++cur_;
      left = Binary("and", std::move(left), Not());
    }
    return left;
  }
  NodePtr Not() {
    Depth depth(&depth_);
    NodePtr result;
    while (IsIdentifier("not")) {
      ++cur_;
      NodePtr n = Make(NodeKind::kUnary);
      n->text = "not";
      n->a = Not();
      result = std::move(n);
    }
    return result ? std::move(result) : Comparison();
  }
  NodePtr Comparison() {
    NodePtr left = Additive();
    while (true) {
      std::string op;
      if (IsIdentifier("not") && IsIdentifier("in", 1)) {
        op = "not in";
        cur_ += 2;
      } else if (IsIdentifier("in")) {
        op = "in";
        ++cur_;
      } else if (Is(TokenType::kComparisonBinaryOperator)) {
        op = t_[cur_++].value;
      } else {
        break;
      }
      left = Binary(op, std::move(left), Additive());
    }
    return left;
  }
  NodePtr Additive() {
    NodePtr left = Multiplicative();
    while (Is(TokenType::kAdditiveBinaryOperator)) {
      std::string op = t_[cur_++].value;
      left = Binary(op, std::move(left), Multiplicative());
    }
    return left;
  }
  NodePtr Multiplicative() {
    NodePtr left = Power();
    while (Is(TokenType::kMultiplicativeBinaryOperator)) {
      std::string op = t_[cur_++].value;
      left = Binary(op, std::move(left), Power());
    }
    return left;
  }
  NodePtr Power() {
    NodePtr left = Test();
    while (Is(TokenType::kExponentiationBinaryOperator)) {
      ++cur_;
      left = Binary("**", std::move(left), Test());
    }
    return left;
  }
  NodePtr Test() {
    NodePtr operand = Filter();
    while (IsIdentifier("is")) {
      ++cur_;
      bool negate = IsIdentifier("not");
      if (negate) ++cur_;
      NodePtr test = Primary();
      if (test->kind != NodeKind::kIdentifier) throw SyntaxError("expected identifier for the test");
      NodePtr n = Make(NodeKind::kTest);
      n->a = std::move(operand);
      n->text = test->text;
      n->negate = negate;
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr Filter() {
    NodePtr operand = UnarySign();
    while (Is(TokenType::kPipe)) {
      ++cur_;
      NodePtr filter = Primary();
      if (filter->kind != NodeKind::kIdentifier) throw SyntaxError("expected identifier for the filter");
      if (Is(TokenType::kOpenParen)) filter = Call(std::move(filter));
      NodePtr n = Make(NodeKind::kFilter);
      n->a = std::move(operand);
      n->b = std::move(filter);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr UnarySign() {
    Depth depth(&depth_);
    if (cur_ < t_.size() &&
        (t_[cur_].type == TokenType::kUnaryOperator || t_[cur_].type == TokenType::kAdditiveBinaryOperator) &&
        (t_[cur_].value == "-" || t_[cur_].value == "+")) {
      NodePtr n = Make(NodeKind::kUnary);
      n->text = t_[cur_++].value;
      n->a = UnarySign();
      return n;
    }
    NodePtr member = Member(Primary());
    if (Is(TokenType::kOpenParen)) return Call(std::move(member));
    return member;
  }
  NodePtr Call(NodePtr callee) {
    NodePtr n = Make(NodeKind::kCall);
    n->a = std::move(callee);
    n->args = Args(false);
    NodePtr e = Member(std::move(n));
    if (Is(TokenType::kOpenParen)) e = Call(std::move(e));
    return e;
  }
  std::vector<NodePtr> Args(bool parameters) {
    Expect(TokenType::kOpenParen, "(");
    std::vector<NodePtr> args;
    bool saw_keyword = false;
    while (!Is(TokenType::kCloseParen)) {
      if (cur_ >= t_.size()) throw SyntaxError("unterminated argument list");
      if (Is(TokenType::kExponentiationBinaryOperator) ||
          (Is(TokenType::kMultiplicativeBinaryOperator) && t_[cur_].value == "*")) {
        if (parameters) throw SyntaxError("argument unpacking is not allowed in parameter declarations");
        bool keyword = Is(TokenType::kExponentiationBinaryOperator);
        ++cur_;
        NodePtr n = Make(keyword ? NodeKind::kKeywordSpread : NodeKind::kSpread);
        n->a = Expression();
        args.push_back(std::move(n));
      } else {
        NodePtr arg = Expression();
        if (Is(TokenType::kEquals)) {
          ++cur_;
          if (arg->kind != NodeKind::kIdentifier) throw SyntaxError("expected identifier for keyword argument");
          NodePtr kw = Make(NodeKind::kKeywordArgument);
          kw->text = arg->text;
          kw->a = Expression();
          arg = std::move(kw);
          saw_keyword = true;
        } else if (saw_keyword) {
          throw SyntaxError("positional argument after keyword argument");
        }
        if (parameters && arg->kind != NodeKind::kIdentifier && arg->kind != NodeKind::kKeywordArgument) {
          throw SyntaxError("expected identifier for parameter declaration");
        }
        args.push_back(std::move(arg));
      }
      if (Is(TokenType::kComma)) ++cur_;
    }
    Expect(TokenType::kCloseParen, ")");
    return args;
  }
  NodePtr MemberArguments() {
    std::vector<NodePtr> slices;
    bool is_slice = false;
    while (!Is(TokenType::kCloseSquareBracket)) {
      if (cur_ >= t_.size()) throw SyntaxError("unterminated subscript");
      if (Is(TokenType::kColon)) {
        slices.push_back(nullptr);
        ++cur_;
        is_slice = true;
      } else {
        slices.push_back(Expression());
        if (Is(TokenType::kColon)) {
          ++cur_;
          is_slice = true;
        }
      }
    }
    if (slices.empty()) throw SyntaxError("expected at least one argument for a subscript");
    if (!is_slice) return std::move(slices[0]);
    if (slices.size() > 3) throw SyntaxError("expected 0-3 arguments for a slice");
    NodePtr n = Make(NodeKind::kSlice);
    n->a = std::move(slices[0]);
    if (slices.size() > 1) n->b = std::move(slices[1]);
    if (slices.size() > 2) n->c = std::move(slices[2]);
    return n;
  }
  NodePtr Member(NodePtr object) {
    while (Is(TokenType::kDot) || Is(TokenType::kOpenSquareBracket)) {
      bool computed = Is(TokenType::kOpenSquareBracket);
      ++cur_;
      NodePtr property;
      if (computed) {
        property = MemberArguments();
        Expect(TokenType::kCloseSquareBracket, "]");
      } else {
        property = Primary();
        if (property->kind != NodeKind::kIdentifier && property->kind != NodeKind::kIntegerLiteral) {
          throw SyntaxError("expected identifier or integer after '.'");
        }
      }
      NodePtr n = Make(NodeKind::kMember);
      n->a = std::move(object);
      n->b = std::move(property);
      n->computed = computed;
      object = std::move(n);
    }
    return object;
  }
  NodePtr Primary() {
    const Token& tok = Peek();
    ++cur_;
    switch (tok.type) {
      case TokenType::kNumericLiteral: {
        if (tok.value.find('.') != std::string::npos) {
          NodePtr n = Make(NodeKind::kFloatLiteral);
          n->number = std::stod(tok.value);
          return n;
        }
        NodePtr n = Make(NodeKind::kIntegerLiteral);
        errno = 0;
        n->integer = std::strtoll(tok.value.c_str(), nullptr, 10);
        if (errno == ERANGE) throw SyntaxError("integer literal " + tok.value + " does not fit 64 bits");
        return n;
      }
      case TokenType::kStringLiteral: {
        NodePtr n = Make(NodeKind::kStringLiteral);
        n->text = tok.value;
        while (Is(TokenType::kStringLiteral)) n->text += t_[cur_++].value;
        return n;
      }
      case TokenType::kIdentifier: {
        NodePtr n = Make(NodeKind::kIdentifier);
        n->text = tok.value;
        return n;
      }
      case TokenType::kOpenParen: {
        NodePtr e = Sequence(false);
        Expect(TokenType::kCloseParen, ")");
        return e;
      }
      case TokenType::kOpenSquareBracket: {
        NodePtr n = Make(NodeKind::kArrayLiteral);
        while (!Is(TokenType::kCloseSquareBracket)) {
          if (cur_ >= t_.size()) throw SyntaxError("unterminated list literal");
          n->args.push_back(Expression());
          if (Is(TokenType::kComma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      case TokenType::kOpenCurlyBracket: {
        NodePtr n = Make(NodeKind::kObjectLiteral);
        while (!Is(TokenType::kCloseCurlyBracket)) {
          if (cur_ >= t_.size()) throw SyntaxError("unterminated dict literal");
          n->args.push_back(Expression());
          Expect(TokenType::kColon, "':' in a dict literal");
          n->args.push_back(Expression());
          if (Is(TokenType::kComma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      default:
        throw SyntaxError("unexpected token '" + tok.value + "'");
    }
  }

  const std::vector<Token>& t_;
  size_t cur_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::unique_ptr<Node>> Parse(const std::vector<Token>& tokens) {
  try {
    return Parser(tokens).Program();
  } catch (const SyntaxError& e) {
    return Unimplemented(std::string("jinja: ") + e.what());
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("jinja: ") + e.what());
  }
}

}  // namespace kvfleet::tok::jinja
