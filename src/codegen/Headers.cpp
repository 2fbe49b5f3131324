// The embedded kernel headers and their content hash.
#include "codegen/Codegen.h"
#include "support/Hash.h"

namespace fpat::codegen {

const std::vector<std::pair<std::string_view, std::string_view>>& embeddedKernelHeaders();

const std::vector<std::pair<std::string_view, std::string_view>>& kernelHeaders() {
  return embeddedKernelHeaders();
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
