// How fpat's tools report command-line mistakes: one line in the tool's voice, a did-you-mean
// for a misspelt option, where to look, exit 2. Header-only: only the tools link CLI11.
#pragma once

#include "fpat/support/Diagnostics.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace fpat {

inline void collectOptionNames(const CLI::App& app, std::vector<std::string>& out) {
  for (const CLI::Option* o : app.get_options())
    for (const std::string& n : o->get_lnames())
      out.push_back("--" + n);
  // Option groups are nameless subcommands.
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->get_name().empty())
      collectOptionNames(*sub, out);
}

/// A validator for whole-number options: at least `lo` (CLI11's own ranges print their bounds
/// as 300-digit numbers, and an unsigned option takes "-1" as 2^64 - 1).
inline CLI::Validator atLeast(unsigned long long lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        const size_t start = s.find_first_not_of(' ');
        if (start != std::string::npos && s[start] == '-')
          return "must be " + std::to_string(lo) + " or more, not " + s;
        errno = 0;
        char* end = nullptr;
        const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno == ERANGE)
          return "'" + s + "' is not a whole number";
        if (v < lo)
          return "must be " + std::to_string(lo) + " or more, not " + s;
        return "";
      },
      "INT>=" + std::to_string(lo));
}

/// Handles a parse exception of `app` (help and version print normally). Returns the exit code.
inline int reportCliError(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv,
                          const std::string& tool) {
  if (dynamic_cast<const CLI::CallForHelp*>(&e) || dynamic_cast<const CLI::CallForVersion*>(&e))
    return app.exit(e);
  std::string msg = e.what(), hint;
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    std::vector<std::string> names;
    collectOptionNames(app, names);
    for (int i = 1; i < argc && hint.empty(); ++i) {
      const std::string a = argv[i];
      const std::string word = a.substr(0, a.find('='));
      if (word.rfind("--", 0) == 0 && std::find(names.begin(), names.end(), word) == names.end())
        if (std::string c = closestMatch(word, names); !c.empty())
          hint = " (did you mean '" + c + "'?)";
    }
  }
  if (!msg.empty())
    msg[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(msg[0])));
  std::cerr << tool << ": error: " << msg << hint << "\nrun '" << tool
            << " --help' for the options\n";
  return 2;
}

} // namespace fpat
