// The Jinja lexer and parser, following @huggingface/jinja's lexer.ts and parser.ts rule
// for rule (whitespace control, unary minus, operator precedence), so that a template
// parses the same way there and here.
#include <cctype>
#include <stdexcept>

#include "common/tokenizer/jinja_internal.h"
#include "common/tokenizer/unicode.h"

namespace kvfleet::tok::jinja {

namespace {

// Parse errors travel as exceptions inside this file and become a Status at its edge.
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
          num += "." + ConsumeDigits();
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
      num += "." + ConsumeDigits();
    }
    tokens_.push_back({std::string(1, c) + num, num.empty() ? TokenType::kUnaryOperator : TokenType::kNumericLiteral});
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

using NodePtr = std::unique_ptr<Node>;

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

  NodePtr Any() {
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

  NodePtr Expression() { return IfExpression(); }

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
        n->integer = std::stoll(tok.value);
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
