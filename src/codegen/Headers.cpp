// The embedded kernel headers and their content hash.
#include "fpat/codegen/Codegen.h"
#include "fpat/support/Hash.h"

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fpat::codegen {

const std::vector<std::pair<std::string_view, std::string_view>>& embeddedKernelHeaders();

// FPAT_KERNEL_HEADERS=DIR replaces the embedded headers with DIR's files of the same names (a
// missing one keeps its embedded text), so that kernel changes can be tried without rebuilding;
// the content hash, and with it every cache key, follows the files.
const std::vector<std::pair<std::string_view, std::string_view>>& kernelHeaders() {
  static const auto headers = [] {
    const char* dir = std::getenv("FPAT_KERNEL_HEADERS");
    auto out = embeddedKernelHeaders();
    if (!dir || !*dir)
      return out;
    static std::deque<std::string> texts; // owns the replaced texts for the process lifetime
    for (auto& [name, text] : out) {
      std::ifstream in(std::filesystem::path(dir) / std::string(name), std::ios::binary);
      if (!in)
        continue;
      std::ostringstream s;
      s << in.rdbuf();
      text = texts.emplace_back(s.str());
    }
    return out;
  }();
  return headers;
}

std::string kernelHeadersHash() {
  static const std::string hash = [] {
    std::string all;
    for (auto& [name, text] : kernelHeaders()) {
      all += name;
      all += '\0';
      all += text;
      all += '\0';
    }
    return sha256Hex(all);
  }();
  return hash;
}

} // namespace fpat::codegen
