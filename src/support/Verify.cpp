#include "fpat/support/Verify.h"

#include <cstdlib>

namespace fpat {

std::vector<Expectation> parseExpectations(const std::string& text,
                                           std::vector<std::string>& problems) {
  std::vector<Expectation> out;
  int line = 1;
  size_t lineStart = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != '\n')
      continue;
    std::string_view l(text.data() + lineStart, i - lineStart);
    size_t pos = 0;
    while ((pos = l.find("expected-", pos)) != std::string_view::npos) {
      size_t p = pos + 9;
      Severity sev;
      if (l.substr(p, 5) == "error") {
        sev = Severity::Error;
        p += 5;
      } else if (l.substr(p, 7) == "warning") {
        sev = Severity::Warning;
        p += 7;
      } else if (l.substr(p, 4) == "note") {
        sev = Severity::Note;
        p += 4;
      } else {
        pos = p;
        continue;
      }
      Expectation e;
      e.severity = sev;
      e.commentLine = line;
      e.line = line;
      if (p < l.size() && l[p] == '@') {
        ++p;
        size_t end = l.find_first_of(" \t{", p);
        std::string spec(l.substr(p, end == std::string_view::npos ? l.size() - p : end - p));
        p = end == std::string_view::npos ? l.size() : end;
        size_t colon = spec.rfind(':');
        if (colon != std::string::npos) {
          e.file = spec.substr(0, colon);
          e.line = std::atoi(spec.c_str() + colon + 1);
        } else if (spec == "*") {
          e.line = 0;
        } else if (!spec.empty() && (spec[0] == '+' || spec[0] == '-')) {
          e.line = line + std::atoi(spec.c_str());
        } else {
          e.line = std::atoi(spec.c_str());
        }
      }
      size_t open = l.find("{{", p);
      size_t close = open == std::string_view::npos ? open : l.find("}}", open + 2);
      if (close == std::string_view::npos) {
        problems.push_back("line " + std::to_string(line) + ": expectation without {{message}}");
        break;
      }
      e.text = std::string(l.substr(open + 2, close - open - 2));
      out.push_back(std::move(e));
      pos = close + 2;
    }
    ++line;
    lineStart = i + 1;
  }
  return out;
}

static bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> verifyDiagnostics(const DiagEngine& diags, int fileId) {
  std::vector<std::string> problems;
  const SourceManager& sm = diags.sources();
  std::vector<Expectation> exps = parseExpectations(sm.file(fileId).text, problems);

  auto tryMatch = [&](Severity sev, const SourceLoc& loc, const std::string& msg) {
    for (Expectation& e : exps) {
      if (e.matched || e.severity != sev || msg.find(e.text) == std::string::npos)
        continue;
      bool fileOk = e.file.empty() ? loc.file == fileId
                                   : loc.file >= 0 && endsWith(sm.file(loc.file).name, e.file);
      if (!fileOk && !(e.line == 0 && e.file.empty()))
        continue;
      if (e.line != 0 && e.line != loc.line)
        continue;
      e.matched = true;
      return true;
    }
    return false;
  };
  auto where = [&](const SourceLoc& loc) {
    if (loc.file < 0)
      return std::string("<no location>");
    return sm.file(loc.file).name + ":" + std::to_string(loc.line) + ":" + std::to_string(loc.col);
  };
  for (const Diagnostic& d : diags.diagnostics()) {
    if (!tryMatch(d.severity, d.loc, d.message))
      problems.push_back("unexpected " + std::string(severityName(d.severity)) + " at " +
                         where(d.loc) + ": " + d.message);
    for (const DiagNote& n : d.notes)
      if (!tryMatch(Severity::Note, n.loc, n.message))
        problems.push_back("unexpected note at " + where(n.loc) + ": " + n.message);
  }
  for (const Expectation& e : exps)
    if (!e.matched)
      problems.push_back("expected " + std::string(severityName(e.severity)) + " on line " +
                         (e.line ? std::to_string(e.line) : std::string("*")) +
                         (e.file.empty() ? "" : " of " + e.file) + " not seen: {{" + e.text +
                         "}} (comment on line " + std::to_string(e.commentLine) + ")");
  return problems;
}

} // namespace fpat
