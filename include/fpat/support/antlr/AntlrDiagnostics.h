// Shared by fpat's two ANTLR front ends (.fgraph and .fpat): token locations and a listener
// that turns lexer and parser errors into located diagnostics. Include only from a parser's
// .cpp; ANTLR types go no further.
#pragma once

#include "fpat/support/Diagnostics.h"

#include <antlr4-runtime.h>
#include <cctype>
#include <map>
#include <string>
#include <vector>

namespace fpat::antlr {

/// The location (and length) of a token in buffer `fileId`.
inline SourceLoc tokenLoc(int fileId, const antlr4::Token* t) {
  SourceLoc loc;
  if (!t)
    return loc;
  loc.file = fileId;
  loc.line = static_cast<int>(t->getLine());
  loc.col = static_cast<int>(t->getCharPositionInLine()) + 1;
  const size_t a = t->getStartIndex(), b = t->getStopIndex();
  loc.len = t->getType() == antlr4::Token::EOF || b < a ? 1 : static_cast<int>(b - a + 1);
  return loc;
}

/// ANTLR names tokens by their grammar names; `names` says what they are ("IDENT" -> "a name").
inline std::string renameTokens(const std::string& msg,
                                const std::map<std::string, std::string>& names) {
  std::string out;
  for (size_t i = 0; i < msg.size();) {
    bool replaced = false;
    for (auto& [from, to] : names) {
      const size_t end = i + from.size();
      const bool wordStart = i == 0 || !std::isalnum(static_cast<unsigned char>(msg[i - 1]));
      const bool wordEnd = end >= msg.size() || !std::isalnum(static_cast<unsigned char>(msg[end]));
      if (wordStart && wordEnd && msg.compare(i, from.size(), from) == 0) {
        out += to;
        i = end;
        replaced = true;
        break;
      }
    }
    if (!replaced)
      out += msg[i++];
  }
  return out;
}

/// `{',', ']'}` -> `',' or ']'`: ANTLR's expected-token sets in prose.
inline std::string proseSet(std::string set) {
  if (set.size() < 2 || set.front() != '{' || set.back() != '}')
    return set;
  set = set.substr(1, set.size() - 2);
  std::vector<std::string> items;
  std::string cur;
  bool quoted = false;
  for (char c : set) {
    if (c == '\'')
      quoted = !quoted;
    if (c == ',' && !quoted) {
      items.push_back(cur);
      cur.clear();
    } else if (!(c == ' ' && cur.empty())) {
      cur += c;
    }
  }
  items.push_back(cur);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

/// ANTLR's default messages in fpat's words: "expected X, found Y" rather than "mismatched
/// input Y expecting X", end of file unquoted, expected sets as prose.
inline std::string reword(const std::string& msg) {
  auto quoted = [](std::string t) { return t == "'end of file'" ? std::string("end of file") : t; };
  auto after = [&](const std::string& prefix) { return msg.substr(prefix.size()); };
  auto split = [&](const std::string& rest, const std::string& sep, std::string& a,
                   std::string& b) {
    const size_t k = rest.rfind(sep);
    if (k == std::string::npos)
      return false;
    a = rest.substr(0, k);
    b = rest.substr(k + sep.size());
    return true;
  };
  std::string a, b;
  if (msg.rfind("extraneous input ", 0) == 0 &&
      split(after("extraneous input "), " expecting ", a, b))
    return "unexpected " + quoted(a) + "; expected " + proseSet(b);
  if (msg.rfind("mismatched input ", 0) == 0 &&
      split(after("mismatched input "), " expecting ", a, b))
    return "expected " + proseSet(b) + ", found " + quoted(a);
  if (msg.rfind("missing ", 0) == 0 && split(after("missing "), " at ", a, b))
    return "expected " + proseSet(a) + " before " + quoted(b);
  if (msg.rfind("no viable alternative at input ", 0) == 0)
    return "unexpected input";
  return msg;
}

/// Routes lexer and parser errors into the diagnostic engine. Tokens of type `badChar` (the
/// grammar's catch-all) are reported as unexpected characters.
class ErrorListener : public antlr4::BaseErrorListener {
  std::string unterminated(antlr4::Token* tok) const {
    antlr4::CharStream* in = tok->getInputStream();
    const size_t a = tok->getStartIndex();
    if (!in || a == INVALID_INDEX || tok->getType() == antlr4::Token::EOF || a >= in->size())
      return "";
    const std::string two = in->getText(antlr4::misc::Interval(a, std::min(a + 1, in->size() - 1)));
    if (two == "/*" && blockComments_)
      return "unterminated comment: this '/*' has no '*/'";
    if (!two.empty() && two[0] == '"' && tok->getText() == "\"")
      return "unterminated string: this '\"' has no closing '\"' on its line";
    return "";
  }

public:
  /// `blockComments`: the language has /* */ comments (an open one is named as such).
  ErrorListener(int fileId, DiagEngine& diags, size_t badChar,
                std::map<std::string, std::string> tokenNames, bool blockComments = false)
      : fileId_(fileId), diags_(diags), badChar_(badChar), names_(std::move(tokenNames)),
        blockComments_(blockComments) {
    names_.emplace("<EOF>", "end of file");
  }
  void syntaxError(antlr4::Recognizer* r, antlr4::Token* tok, size_t line, size_t col,
                   const std::string& msg, std::exception_ptr) override {
    SourceLoc loc = tok ? tokenLoc(fileId_, tok)
                        : SourceLoc{fileId_, static_cast<int>(line), static_cast<int>(col) + 1, 1};
    if (tok) {
      // A '/*' or '"' the lexer could not close lexes as single characters; say what is open.
      if (std::string open = unterminated(tok); !open.empty()) {
        diags_.error(loc, open);
        return;
      }
    }
    if (tok && tok->getType() == badChar_) {
      diags_.error(loc, "unexpected character '" + tok->getText() + "'");
      return;
    }
    // Where text is missing (and at the end of the file), point just past the token before,
    // where it goes, not at what follows (maybe on a later line).
    if (auto* parser = dynamic_cast<antlr4::Parser*>(r);
        parser && tok && (tok->getType() == antlr4::Token::EOF || msg.rfind("missing ", 0) == 0) &&
        tok->getTokenIndex() > 0 && tok->getTokenIndex() != static_cast<size_t>(-1)) {
      const antlr4::Token* last = parser->getTokenStream()->get(tok->getTokenIndex() - 1);
      if (last->getType() != antlr4::Token::EOF) {
        loc = tokenLoc(fileId_, last);
        loc.col += loc.len;
        loc.len = 1;
      }
    }
    std::string text = reword(renameTokens(msg, names_));
    if (text == "unexpected input" && tok)
      text = tok->getType() == antlr4::Token::EOF ? "unexpected end of file"
                                                  : "unexpected '" + tok->getText() + "'";
    // The parser read a token in the middle of a line as the start of a new statement (the
    // usual cause: a ',' missing before it) and only failed later, maybe lines further on.
    // Say so where the statement went wrong, and keep ANTLR's point as a note.
    if (const antlr4::Token* start = midLineStatementStart(r); start && start != tok) {
      diags_.error(tokenLoc(fileId_, start),
                   "syntax error: unexpected '" + start->getText() + "' (a missing ','?)");
      diags_.note(loc, "read as the start of a new statement, which fails here: " + text);
      return;
    }
    diags_.error(loc, "syntax error: " + text);
  }

private:
  /// The first token of the statement (grammar rule `stmt`, in both languages) being parsed,
  /// when a token of the statement before it precedes it on the same line (not a ';' or a
  /// brace, which end statements).
  static const antlr4::Token* midLineStatementStart(antlr4::Recognizer* r) {
    auto* parser = dynamic_cast<antlr4::Parser*>(r);
    if (!parser)
      return nullptr;
    const std::vector<std::string>& rules = parser->getRuleNames();
    antlr4::ParserRuleContext* ctx = parser->getContext();
    while (ctx && !(ctx->getRuleIndex() < rules.size() && rules[ctx->getRuleIndex()] == "stmt"))
      ctx = dynamic_cast<antlr4::ParserRuleContext*>(ctx->parent);
    if (!ctx || !ctx->getStart())
      return nullptr;
    const antlr4::Token* start = ctx->getStart();
    const size_t index = start->getTokenIndex();
    if (index == 0 || index == static_cast<size_t>(-1))
      return nullptr;
    const antlr4::Token* prev = parser->getTokenStream()->get(index - 1);
    const std::string p = prev->getText();
    if (prev->getLine() != start->getLine() || p == ";" || p == "{" || p == "}")
      return nullptr;
    return start;
  }

  int fileId_;
  DiagEngine& diags_;
  size_t badChar_;
  std::map<std::string, std::string> names_;
  bool blockComments_;
};

} // namespace fpat::antlr
