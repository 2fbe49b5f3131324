// fpat-check: a small FileCheck. Reads a program's output on stdin and checks it against the
// `CHECK:` lines written in a test file:
//   CHECK: text        a later line contains text
//   CHECK-NEXT: text   the very next line contains text
//   CHECK-NOT: text    no line between the previous and the next match contains text
// Exit code 0 when every check holds; otherwise each failure is printed with its line.
#include "fpat/support/Diagnostics.h"

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Check {
  enum Kind { Plain, Next, Not } kind;
  std::string text;
  int line;
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fpat-check CHECK-FILE < output\n";
    return 2;
  }
  std::string checkText;
  if (!fpat::readFile(argv[1], checkText)) {
    std::cerr << "fpat-check: cannot read " << argv[1] << "\n";
    return 2;
  }
  std::vector<Check> checks;
  std::istringstream cs(checkText);
  std::string l;
  for (int n = 1; std::getline(cs, l); ++n) {
    for (auto [tag, kind] : {std::pair{"CHECK-NEXT:", Check::Next},
                             {"CHECK-NOT:", Check::Not},
                             {"CHECK:", Check::Plain}}) {
      size_t p = l.find(tag);
      if (p != std::string::npos) {
        checks.push_back({kind, trim(l.substr(p + std::string(tag).size())), n});
        break;
      }
    }
  }
  if (checks.empty()) {
    std::cerr << "fpat-check: " << argv[1] << " has no CHECK lines\n";
    return 2;
  }
  std::vector<std::string> out;
  while (std::getline(std::cin, l))
    out.push_back(l);

  size_t pos = 0; // next output line to look at
  std::vector<const Check*> pendingNot;
  int failures = 0;
  auto report = [&](const Check& c, const std::string& what) {
    std::cerr << argv[1] << ":" << c.line << ": error: " << what << ": " << c.text << "\n";
    ++failures;
  };
  for (const Check& c : checks) {
    if (c.kind == Check::Not) {
      pendingNot.push_back(&c);
      continue;
    }
    size_t found = out.size();
    if (c.kind == Check::Next) {
      if (pos < out.size() && out[pos].find(c.text) != std::string::npos)
        found = pos;
    } else {
      for (size_t i = pos; i < out.size(); ++i)
        if (out[i].find(c.text) != std::string::npos) {
          found = i;
          break;
        }
    }
    if (found == out.size()) {
      report(c, c.kind == Check::Next ? "CHECK-NEXT not on the next line (" +
                                            (pos < out.size() ? "'" + out[pos] + "'" : "end") + ")"
                                      : "CHECK not found after output line " + std::to_string(pos));
      continue;
    }
    for (const Check* n : pendingNot)
      for (size_t i = pos; i < found; ++i)
        if (out[i].find(n->text) != std::string::npos)
          report(*n, "CHECK-NOT matched output line " + std::to_string(i + 1));
    pendingNot.clear();
    pos = found + 1;
  }
  for (const Check* n : pendingNot)
    for (size_t i = pos; i < out.size(); ++i)
      if (out[i].find(n->text) != std::string::npos)
        report(*n, "CHECK-NOT matched output line " + std::to_string(i + 1));
  return failures ? 1 : 0;
}
