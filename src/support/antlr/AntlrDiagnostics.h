// Shared by fpat's two ANTLR front ends (.fgraph and .fpat): token locations and a listener
// that turns lexer and parser errors into located diagnostics. Include only from a parser's
// .cpp; ANTLR types go no further.
#pragma once

#include "fpat/support/Diagnostics.h"

#include <antlr4-runtime.h>
#include <cctype>
#include <map>
#include <string>

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

/// Routes lexer and parser errors into the diagnostic engine. Tokens of type `badChar` (the
/// grammar's catch-all) are reported as unexpected characters.
class ErrorListener : public antlr4::BaseErrorListener {
public:
  ErrorListener(int fileId, DiagEngine& diags, size_t badChar,
                std::map<std::string, std::string> tokenNames)
      : fileId_(fileId), diags_(diags), badChar_(badChar), names_(std::move(tokenNames)) {
    names_.emplace("<EOF>", "end of file");
  }
  void syntaxError(antlr4::Recognizer*, antlr4::Token* tok, size_t line, size_t col,
                   const std::string& msg, std::exception_ptr) override {
    SourceLoc loc = tok ? tokenLoc(fileId_, tok)
                        : SourceLoc{fileId_, static_cast<int>(line), static_cast<int>(col) + 1, 1};
    if (tok && tok->getType() == badChar_)
      diags_.error(loc, "unexpected character '" + tok->getText() + "'");
    else
      diags_.error(loc, "syntax error: " + renameTokens(msg, names_));
  }

private:
  int fileId_;
  DiagEngine& diags_;
  size_t badChar_;
  std::map<std::string, std::string> names_;
};

} // namespace fpat::antlr
