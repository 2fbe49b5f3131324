// .fpat parse tree -> AST. ANTLR types stay in this file.
#include "FpatBaseVisitor.h"
#include "FpatLexer.h"
#include "FpatParser.h"
#include "fpat/dsl/AST.h"
#include "fpat/support/antlr/AntlrDiagnostics.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <functional>
#include <map>
#include <pthread.h>

namespace fpat::dsl {
namespace {

using namespace fpat_dsl;
using antlr4::Token;

// Limits that keep hostile input (deep nesting, endless operator chains) from exhausting the
// stack of the recursive-descent parser and of the tree walks after it.
constexpr int kMaxNesting = 256;
constexpr int kMaxOperatorsPerStmt = 4096;
constexpr size_t kParseStack = size_t{256} << 20;

SourceLoc tokLoc(int fileId, const Token* t) {
  return antlr::tokenLoc(fileId, t);
}

/// The one visitor: converts each parse-tree node into its AST node.
class AstBuilder : public FpatBaseVisitor {
public:
  explicit AstBuilder(int fileId) : f_(fileId) {}

  SourceLoc loc(Token* t) const { return tokLoc(f_, t); }
  SourceLoc loc(antlr4::tree::TerminalNode* n) const {
    return n ? loc(n->getSymbol()) : SourceLoc{};
  }
  SourceLoc loc(antlr4::ParserRuleContext* c) const { return loc(c->getStart()); }

  static std::string unquote(const std::string& s) {
    std::string out;
    for (size_t i = 1; i + 1 < s.size(); ++i) {
      if (s[i] == '\\' && i + 2 < s.size()) {
        char c = s[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += s[i];
      }
    }
    return out;
  }

  StmtPtr stmt(FpatParser::StmtContext* c) {
    if (auto* s = c->includeStmt()) {
      auto st = make(Stmt::Include, s);
      st->name = unquote(s->STRING()->getText());
      st->loc = loc(s->STRING());
      return st;
    }
    if (auto* s = c->classDef())
      return classDef(s);
    if (auto* s = c->defStmt())
      return def(s);
    if (auto* s = c->defmStmt())
      return defm(s);
    if (auto* s = c->multiclass()) {
      auto st = make(Stmt::Multiclass, s);
      st->name = s->name->getText();
      st->loc = loc(s->name);
      if (s->templateArgs())
        st->targs = templateArgs(s->templateArgs());
      for (auto* x : s->stmt())
        st->stmts.push_back(stmt(x));
      return st;
    }
    if (auto* s = c->letStmt()) {
      auto st = make(Stmt::Let, s);
      for (auto* item : s->letItem()) {
        st->lets.emplace_back(item->name->getText(), value(item->value()));
        st->letLocs.push_back(loc(item->name));
      }
      for (auto* x : s->stmt())
        st->stmts.push_back(stmt(x));
      return st;
    }
    auto* s = c->defvar();
    auto st = make(Stmt::Defvar, s);
    st->name = s->name->getText();
    st->loc = loc(s->name);
    st->value = value(s->value());
    return st;
  }

private:
  StmtPtr make(Stmt::Kind k, antlr4::ParserRuleContext* c) {
    auto st = std::make_unique<Stmt>();
    st->kind = k;
    st->loc = loc(c);
    return st;
  }

  TypeRef type(FpatParser::TypeContext* c) {
    TypeRef t;
    t.loc = loc(c);
    if (c->type()) {
      t.name = "list";
      t.elem = std::make_unique<TypeRef>(type(c->type()));
    } else {
      t.name = c->name ? c->name->getText() : "expr";
    }
    return t;
  }

  std::vector<TemplateArg> templateArgs(FpatParser::TemplateArgsContext* c) {
    std::vector<TemplateArg> out;
    for (auto* a : c->templateArg()) {
      TemplateArg t;
      t.type = type(a->type());
      t.name = a->name->getText();
      t.loc = loc(a->name);
      if (a->value())
        t.defaultValue = value(a->value());
      out.push_back(std::move(t));
    }
    return out;
  }

  ParentRef parentRef(FpatParser::ParentRefContext* c) {
    ParentRef p;
    p.name = c->name->getText();
    p.loc = loc(c->name);
    if (c->valueList())
      for (auto* v : c->valueList()->value())
        p.args.push_back(value(v));
    return p;
  }

  std::vector<BodyItem> body(FpatParser::BodyContext* c) {
    std::vector<BodyItem> out;
    for (auto* item : c->bodyItem()) {
      BodyItem b;
      if (auto* let = dynamic_cast<FpatParser::FieldLetContext*>(item)) {
        b.isLet = true;
        b.name = let->name->getText();
        b.loc = loc(let->name);
        b.value = value(let->value());
      } else {
        auto* decl = static_cast<FpatParser::FieldDeclContext*>(item);
        b.type = type(decl->type());
        b.name = decl->name->getText();
        b.loc = loc(decl->name);
        if (decl->value())
          b.value = value(decl->value());
      }
      out.push_back(std::move(b));
    }
    return out;
  }

  std::vector<NamePiece> defName(FpatParser::DefNameContext* c) {
    std::vector<NamePiece> out;
    for (auto* p : c->namePiece()) {
      NamePiece n;
      n.isString = p->STRING() != nullptr;
      n.text = n.isString ? unquote(p->STRING()->getText()) : p->IDENT()->getText();
      n.loc = loc(p);
      out.push_back(std::move(n));
    }
    return out;
  }

  StmtPtr classDef(FpatParser::ClassDefContext* c) {
    auto st = make(Stmt::Class, c);
    st->name = c->name->getText();
    st->loc = loc(c->name);
    if (c->templateArgs())
      st->targs = templateArgs(c->templateArgs());
    if (c->parents())
      for (auto* p : c->parents()->parentRef())
        st->parents.push_back(parentRef(p));
    st->body = body(c->body());
    return st;
  }

  StmtPtr def(FpatParser::DefStmtContext* c) {
    auto st = make(Stmt::Def, c);
    if (c->defName()) {
      st->hasName = true;
      st->defName = defName(c->defName());
      st->loc = loc(c->defName());
    }
    if (c->parents())
      for (auto* p : c->parents()->parentRef())
        st->parents.push_back(parentRef(p));
    st->body = body(c->body());
    return st;
  }

  StmtPtr defm(FpatParser::DefmStmtContext* c) {
    auto st = make(Stmt::Defm, c);
    if (c->defName()) {
      st->hasName = true;
      st->defName = defName(c->defName());
      st->loc = loc(c->defName());
    }
    for (auto* p : c->parentRef())
      st->parents.push_back(parentRef(p));
    return st;
  }

  ExprPtr node(Expr::Kind k, SourceLoc l) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->loc = l;
    return e;
  }

  static double toDouble(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

  ExprPtr number(antlr4::tree::TerminalNode* i, antlr4::tree::TerminalNode* f, bool neg,
                 SourceLoc l) {
    if (i) {
      auto e = node(Expr::Int, l);
      std::string s = i->getText();
      errno = 0;
      long long v = std::strtoll(s.c_str(), nullptr, 10);
      if (errno == ERANGE || s.size() > 18) {
        e->kind = Expr::Float; // out of int64 range: keep it as a float, sema complains
        e->f = (neg ? -1 : 1) * toDouble(s);
        e->s = "overflow";
      } else {
        e->i = neg ? -v : v;
      }
      return e;
    }
    auto e = node(Expr::Float, l);
    e->f = (neg ? -1 : 1) * toDouble(f->getText());
    if (!std::isfinite(e->f))
      e->s = "overflow"; // 1e999: sema reports it (inf would print back as text that fails)
    return e;
  }

public:
  ExprPtr value(FpatParser::ValueContext* c) {
    SourceLoc l = loc(c);
    if (auto* v = dynamic_cast<FpatParser::IntValueContext*>(c))
      return number(v->INT(), nullptr, false, l);
    if (auto* v = dynamic_cast<FpatParser::FloatValueContext*>(c))
      return number(nullptr, v->FLOAT(), false, l);
    if (auto* v = dynamic_cast<FpatParser::NegValueContext*>(c))
      return number(v->INT(), v->FLOAT(), true, l);
    if (auto* v = dynamic_cast<FpatParser::StringValueContext*>(c)) {
      auto e = node(Expr::String, l);
      e->s = unquote(v->STRING()->getText());
      return e;
    }
    if (dynamic_cast<FpatParser::BoolValueContext*>(c)) {
      auto e = node(Expr::Bool, l);
      e->i = c->getText() == "true";
      return e;
    }
    if (dynamic_cast<FpatParser::UnsetValueContext*>(c))
      return node(Expr::Unset, l);
    if (auto* v = dynamic_cast<FpatParser::ListValueContext*>(c)) {
      auto e = node(Expr::List, l);
      if (v->valueList())
        for (auto* x : v->valueList()->value())
          e->kids.push_back(value(x));
      return e;
    }
    if (auto* v = dynamic_cast<FpatParser::InstanceValueContext*>(c)) {
      auto e = node(Expr::Instance, loc(v->name));
      e->s = v->name->getText();
      if (v->valueList())
        for (auto* x : v->valueList()->value())
          e->kids.push_back(value(x));
      return e;
    }
    if (auto* v = dynamic_cast<FpatParser::NameValueContext*>(c)) {
      auto e = node(Expr::Name, l);
      e->s = v->name->getText();
      return e;
    }
    if (auto* v = dynamic_cast<FpatParser::BindingValueContext*>(c)) {
      auto e = node(Expr::Binding, l);
      e->s = v->BINDING()->getText().substr(1);
      return e;
    }
    if (auto* v = dynamic_cast<FpatParser::DagValueContext*>(c)) {
      auto e = node(Expr::Dag, l);
      e->kids.push_back(value(v->value()));
      if (v->dagArgs())
        for (auto* x : v->dagArgs()->value())
          e->kids.push_back(value(x));
      if (v->BINDING())
        e->dagName = v->BINDING()->getText().substr(1);
      return e;
    }
    auto* v = static_cast<FpatParser::ExprValueContext*>(c);
    auto e = node(Expr::Body, l);
    for (auto* let : v->exprLet()) {
      e->lets.emplace_back(let->name->getText(), expr(let->expr()));
      e->letLocs.push_back(loc(let->name));
    }
    e->kids.push_back(expr(v->expr()));
    return e;
  }

  ExprPtr expr(FpatParser::ExprContext* c) {
    if (auto* x = dynamic_cast<FpatParser::ParenExprContext*>(c))
      return expr(x->expr());
    if (auto* x = dynamic_cast<FpatParser::CallExprContext*>(c)) {
      auto e = node(Expr::Call, loc(x->fn));
      e->s = x->fn->getText();
      for (auto* a : x->expr())
        e->kids.push_back(expr(a));
      return e;
    }
    if (auto* x = dynamic_cast<FpatParser::NegExprContext*>(c)) {
      auto e = node(Expr::Unary, loc(c));
      e->s = "-";
      e->kids.push_back(expr(x->expr()));
      return e;
    }
    if (auto* x = dynamic_cast<FpatParser::BinExprContext*>(c)) {
      auto e = node(Expr::Binary, loc(x->op));
      e->s = x->op->getText();
      e->kids.push_back(expr(x->expr(0)));
      e->kids.push_back(expr(x->expr(1)));
      return e;
    }
    if (auto* x = dynamic_cast<FpatParser::SelectExprContext*>(c)) {
      auto e = node(Expr::Select, loc(c));
      for (int i = 0; i < 3; ++i)
        e->kids.push_back(expr(x->expr(static_cast<size_t>(i))));
      return e;
    }
    if (auto* x = dynamic_cast<FpatParser::NumExprContext*>(c))
      return number(x->INT(), x->FLOAT(), false, loc(c));
    auto* x = static_cast<FpatParser::NameExprContext*>(c);
    auto e = node(Expr::Name, loc(c));
    e->s = x->name->getText();
    return e;
  }

private:
  int f_;
};

bool hasErrors(antlr4::tree::ParseTree* t) {
  // Iterative: trees of hostile input can be deep.
  std::vector<antlr4::tree::ParseTree*> todo{t};
  while (!todo.empty()) {
    auto* n = todo.back();
    todo.pop_back();
    if (dynamic_cast<antlr4::tree::ErrorNode*>(n))
      return true;
    if (auto* ctx = dynamic_cast<antlr4::ParserRuleContext*>(n); ctx && ctx->exception)
      return true;
    for (auto* c : n->children)
      todo.push_back(c);
  }
  return false;
}

/// Checks nesting and operator counts on the token stream before parsing.
bool checkComplexity(antlr4::CommonTokenStream& tokens, int fileId, DiagEngine& diags) {
  int depth = 0, ops = 0;
  for (Token* t : tokens.getTokens()) {
    const std::string text = t->getText();
    if (text == "(" || text == "[" || text == "{") {
      if (++depth > kMaxNesting) {
        diags.error(tokLoc(fileId, t),
                    "nesting is deeper than " + std::to_string(kMaxNesting) + " levels");
        return false;
      }
    } else if (text == ")" || text == "]" || text == "}") {
      depth = std::max(0, depth - 1);
    }
    if (depth == 0 && (text == ";" || text == "}"))
      ops = 0;
    if (text.size() <= 2 && std::string_view("+-*/?<>=!").find(text[0]) != std::string_view::npos &&
        t->getType() != Token::EOF) {
      if (++ops > kMaxOperatorsPerStmt) {
        diags.error(tokLoc(fileId, t), "statement has more than " +
                                           std::to_string(kMaxOperatorsPerStmt) + " operators");
        return false;
      }
    }
  }
  return true;
}

/// Runs `fn` on a thread with a large stack (ANTLR's parser is recursive).
void runWithBigStack(const std::function<void()>& fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kParseStack);
  pthread_t th;
  auto trampoline = [](void* p) -> void* {
    (*static_cast<const std::function<void()>*>(p))();
    return nullptr;
  };
  if (pthread_create(&th, &attr, trampoline, const_cast<std::function<void()>*>(&fn)) != 0) {
    pthread_attr_destroy(&attr);
    fn(); // no thread available: parse on this stack
    return;
  }
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
}

} // namespace

std::string preprocess(const std::string& text, int fileId, DiagEngine& diags,
                       std::set<std::string>& macros) {
  struct Open {
    SourceLoc loc;     // of the #ifdef / #ifndef
    bool parentActive; // whether the enclosing region is active
    bool taken;        // the condition held (the #if part is active)
    bool sawElse = false;
  };
  std::vector<Open> open;
  auto active = [&] { return open.empty() || (open.back().parentActive && open.back().taken); };
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size() || pos == 0) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line(text.data() + pos, end - pos);
    size_t i = line.find_first_not_of(" \t\r");
    std::string_view word;
    if (i != std::string_view::npos && line[i] == '#') {
      size_t j = i + 1;
      while (j < line.size() && std::isalpha(static_cast<unsigned char>(line[j])))
        ++j;
      word = line.substr(i + 1, j - i - 1);
      if (word != "define" && word != "ifdef" && word != "ifndef" && word != "else" &&
          word != "endif")
        word = {}; // `#` is also the paste operator
    }
    if (word.empty()) {
      if (active())
        out.append(line);
      else // keep the line's length out of the lexer but its newline for the locations
        for (char c : line)
          out += c == '\r' ? '\r' : ' ';
    } else {
      const SourceLoc at =
          diags.sources().locForOffset(fileId, pos + i, 1 + static_cast<int>(word.size()));
      // The rest of the line: a name where one is wanted, then nothing but a comment.
      std::string_view rest = line.substr(i + 1 + word.size());
      const size_t comment = rest.find("//");
      if (comment != std::string_view::npos)
        rest = rest.substr(0, comment);
      size_t a = rest.find_first_not_of(" \t\r"), b = a;
      while (b < rest.size() &&
             (std::isalnum(static_cast<unsigned char>(rest[b])) || rest[b] == '_'))
        ++b;
      const std::string name =
          a == std::string_view::npos ? "" : std::string(rest.substr(a, b - a));
      const bool wantsName = word == "define" || word == "ifdef" || word == "ifndef";
      const bool nameOk = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
      const size_t tail = rest.find_first_not_of(
          " \t\r", wantsName && nameOk ? b : (a == std::string_view::npos ? rest.size() : a));
      if (wantsName && !nameOk)
        diags.error(at, "'#" + std::string(word) + "' needs a name");
      else if (tail != std::string_view::npos)
        diags.error(diags.sources().locForOffset(fileId, pos + i + 1 + word.size() + tail),
                    "unexpected text after '#" + std::string(word) + "'");
      else if (word == "define") {
        if (active())
          macros.insert(name);
      } else if (word == "ifdef" || word == "ifndef") {
        const bool defined = macros.count(name) > 0;
        open.push_back({at, active(), word == "ifdef" ? defined : !defined});
      } else if (open.empty()) {
        diags.error(at, "'#" + std::string(word) + "' without '#ifdef' or '#ifndef'");
      } else if (word == "else") {
        if (open.back().sawElse) {
          diags.error(at, "a second '#else' for the same '#ifdef'");
          diags.note(open.back().loc, "the '#ifdef' is here");
        }
        open.back().sawElse = true;
        open.back().taken = !open.back().taken;
      } else { // endif
        open.pop_back();
      }
      for (char c : line) // the directive line itself is blank for the parser
        out += c == '\r' ? '\r' : ' ';
    }
    if (end >= text.size())
      break;
    out += '\n';
    pos = end + 1;
  }
  for (const Open& o : open)
    diags.error(o.loc, "'#ifdef' or '#ifndef' without '#endif' at the end of the file");
  return out;
}

std::unique_ptr<File> parseFile(int fileId, DiagEngine& diags, std::set<std::string>* macros) {
  const std::string& raw = diags.sources().file(fileId).text;
  size_t bad = 0;
  if (!validateUtf8(raw, &bad)) {
    diags.error(diags.sources().locForOffset(fileId, bad),
                "invalid UTF-8 byte; .fpat files are UTF-8 text");
    return nullptr;
  }
  const int before = diags.errorCount();
  std::string preprocessed;
  if (macros)
    preprocessed = preprocess(raw, fileId, diags, *macros);
  const std::string& text = macros ? preprocessed : raw;
  if (diags.errorCount() > before)
    return nullptr;
  std::unique_ptr<File> file;
  std::exception_ptr failure;
  runWithBigStack([&] {
    try {
      antlr4::ANTLRInputStream input(text);
      FpatLexer lexer(&input);
      antlr::ErrorListener listener(fileId, diags, FpatLexer::BAD_CHAR,
                                    {{"IDENT", "a name"},
                                     {"INT", "an integer"},
                                     {"FLOAT", "a number"},
                                     {"STRING", "a string"},
                                     {"BINDING", "a $binding"}},
                                    /*blockComments=*/true);
      lexer.removeErrorListeners();
      lexer.addErrorListener(&listener);
      antlr4::CommonTokenStream tokens(&lexer);
      tokens.fill();
      if (!checkComplexity(tokens, fileId, diags))
        return;
      FpatParser parser(&tokens);
      parser.removeErrorListeners();
      parser.addErrorListener(&listener);
      FpatParser::FileContext* tree = parser.file();
      if (diags.errorCount() > before || hasErrors(tree))
        return;
      AstBuilder builder(fileId);
      file = std::make_unique<File>();
      file->fileId = fileId;
      for (auto* s : tree->stmt())
        file->stmts.push_back(builder.stmt(s));
    } catch (...) {
      failure = std::current_exception();
    }
  });
  if (failure)
    std::rethrow_exception(failure);
  if (diags.errorCount() > before)
    return nullptr;
  return file;
}

} // namespace fpat::dsl
