// SHA-256, for content-addressed caches.
#pragma once

#include <string>
#include <string_view>

namespace fpat {

/// Lower-case hex SHA-256 of `data`.
std::string sha256Hex(std::string_view data);

} // namespace fpat
