#include "fpat/support/Diagnostics.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <sys/mman.h>
#include <thread>
#include <vector>

namespace fpat {

int SourceManager::addBuffer(std::string name, std::string text) {
  SourceFile f;
  f.name = std::move(name);
  f.text = std::move(text);
  f.lineStarts.push_back(0);
  for (size_t i = 0; i < f.text.size(); ++i)
    if (f.text[i] == '\n')
      f.lineStarts.push_back(i + 1);
  files_.push_back(std::move(f));
  return static_cast<int>(files_.size()) - 1;
}

std::string_view SourceManager::lineText(int fileId, int line) const {
  if (fileId < 0 || fileId >= numFiles() || line < 1)
    return {};
  const SourceFile& f = file(fileId);
  if (static_cast<size_t>(line) > f.lineStarts.size())
    return {};
  size_t begin = f.lineStarts[static_cast<size_t>(line) - 1];
  size_t end = f.text.find('\n', begin);
  if (end == std::string::npos)
    end = f.text.size();
  std::string_view sv(f.text);
  sv = sv.substr(begin, end - begin);
  if (!sv.empty() && sv.back() == '\r')
    sv.remove_suffix(1);
  return sv;
}

SourceLoc SourceManager::locForOffset(int fileId, size_t offset, int len) const {
  const SourceFile& f = file(fileId);
  auto it = std::upper_bound(f.lineStarts.begin(), f.lineStarts.end(), offset);
  size_t lineIdx = static_cast<size_t>(it - f.lineStarts.begin()) - 1;
  SourceLoc loc;
  loc.file = fileId;
  loc.line = static_cast<int>(lineIdx) + 1;
  loc.col = static_cast<int>(offset - f.lineStarts[lineIdx]) + 1;
  loc.len = len;
  return loc;
}

const char* severityName(Severity s) {
  switch (s) {
  case Severity::Error:
    return "error";
  case Severity::Warning:
    return "warning";
  case Severity::Note:
    return "note";
  }
  return "error";
}

void DiagEngine::report(Severity sev, SourceLoc loc, std::string message) {
  if (sev == Severity::Warning && werror_)
    sev = Severity::Error;
  if (sev == Severity::Error && limitReached()) {
    if (!limitNoted_) {
      limitNoted_ = true;
      if (out_) {
        flush();
        *out_ << "fatal: too many errors emitted, stopping now (limit " << errorLimit_ << ")\n";
      }
    }
    return;
  }
  flush();
  Diagnostic d;
  d.severity = sev;
  d.loc = loc;
  d.message = std::move(message);
  diags_.push_back(std::move(d));
  if (sev == Severity::Error)
    ++errors_;
  else
    ++warnings_;
}

void DiagEngine::note(SourceLoc loc, std::string message) {
  if (diags_.empty() || printed_ == diags_.size())
    return; // dropped together with its (suppressed or printed) parent
  diags_.back().notes.push_back({loc, std::move(message)});
}

void DiagEngine::flush() {
  for (; printed_ < diags_.size(); ++printed_)
    if (out_)
      *out_ << render(diags_[printed_]);
  if (out_)
    out_->flush();
}

std::string DiagEngine::renderOne(Severity sev, const SourceLoc& loc,
                                  const std::string& msg) const {
  std::ostringstream os;
  if (loc.file >= 0 && loc.file < sm_.numFiles()) {
    os << sm_.file(loc.file).name;
    if (loc.line > 0)
      os << ':' << loc.line << ':' << loc.col;
    os << ": ";
  }
  os << severityName(sev) << ": " << msg << '\n';
  if (loc.valid()) {
    std::string_view line = sm_.lineText(loc.file, loc.line);
    std::string shown;
    std::string caret;
    // Tabs are kept so the caret lines up; other control bytes are shown as '?'.
    for (size_t i = 0; i < line.size() && i < 400; ++i) {
      unsigned char c = static_cast<unsigned char>(line[i]);
      shown += (c < 0x20 && c != '\t') || c == 0x7f ? '?' : static_cast<char>(c);
    }
    if (line.size() > 400)
      shown += "...";
    size_t col = static_cast<size_t>(loc.col - 1);
    for (size_t i = 0; i < col && i < shown.size(); ++i)
      caret += shown[i] == '\t' ? '\t' : ' ';
    if (col > shown.size())
      caret.append(col - shown.size(), ' ');
    caret += '^';
    size_t avail = col < shown.size() ? shown.size() - col : 0;
    size_t tildes =
        loc.len > 1 ? std::min<size_t>(static_cast<size_t>(loc.len) - 1, avail > 0 ? avail - 1 : 0)
                    : 0;
    caret.append(tildes, '~');
    os << shown << '\n' << caret << '\n';
  }
  return os.str();
}

std::string DiagEngine::render(const Diagnostic& d) const {
  std::string s = renderOne(d.severity, d.loc, d.message);
  for (const DiagNote& n : d.notes)
    s += renderOne(Severity::Note, n.loc, n.message);
  return s;
}

bool validateUtf8(std::string_view s, size_t* badOffset) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      if (badOffset)
        *badOffset = i;
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        if (badOffset)
          *badOffset = i;
        return false;
      }
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    // Reject overlong forms, surrogates and out-of-range code points.
    static const uint32_t minCp[] = {0, 0x80, 0x800, 0x10000};
    if (cp < minCp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      if (badOffset)
        *badOffset = i;
      return false;
    }
    i += n + 1;
  }
  return true;
}

std::string closestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  std::string best;
  size_t bestDist = limit + 1;
  for (const std::string& c : candidates) {
    if (c == word)
      continue;
    // Levenshtein distance with transpositions counted as one edit (Damerau, restricted).
    const size_t n = word.size(), m = c.size();
    if ((n > m ? n - m : m - n) > limit)
      continue; // too far apart in length to be within the limit
    std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
    for (size_t i = 0; i <= n; ++i)
      d[i][0] = i;
    for (size_t j = 0; j <= m; ++j)
      d[0][j] = j;
    for (size_t i = 1; i <= n; ++i)
      for (size_t j = 1; j <= m; ++j) {
        const size_t cost = word[i - 1] == c[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && word[i - 1] == c[j - 2] && word[i - 2] == c[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    if (d[n][m] < bestDist) {
      bestDist = d[n][m];
      best = c;
    }
  }
  if (!best.empty())
    return best;
  // A word that is the start of a name, or starts with one ("transpose" for "transpose_b",
  // "epsilon" for "eps").
  for (const std::string& c : candidates) {
    const size_t k = std::min(c.size(), word.size());
    if (k >= 3 && c != word && c.compare(0, k, word.substr(0, k)) == 0)
      return c;
  }
  return "";
}

std::string didYouMean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string c = closestMatch(word, candidates);
  return c.empty() ? "" : " (did you mean '" + c + "'?)";
}

std::string displayPath(const std::string& path) {
  if (path.empty() || path[0] != '/')
    return path;
  return path.substr(path.find_last_of('/') + 1);
}

std::string formatDouble(double v) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v < 0 ? "-inf" : "inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  std::string s = buf;
  // Keep a marker that this is a floating-point literal.
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}

namespace {

/// "2.0 GiB", "512 MiB", "100 bytes": the limit as a reader would say it.
std::string byteCount(size_t n) {
  std::ostringstream os;
  if (n >= (size_t{1} << 30) && n % (size_t{1} << 30) == 0)
    os << (n >> 30) << " GiB";
  else if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0)
    os << (n >> 20) << " MiB";
  else
    os << n << (n == 1 ? " byte" : " bytes");
  return os.str();
}

/// Reads `in` to its end in chunks, at most `maxBytes`; false with the reason otherwise.
bool readStream(std::istream& in, std::string& out, std::string* why, size_t maxBytes,
                const char* errorWhat) {
  out.clear();
  std::vector<char> chunk(size_t{1} << 20);
  try {
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto got = static_cast<size_t>(in.gcount());
      if (out.size() + got > maxBytes) {
        out.clear();
        out.shrink_to_fit();
        if (why)
          *why = "is longer than " + byteCount(maxBytes) +
                 ", the most fpat reads from a pipe or device (an endless stream?)";
        return false;
      }
      out.append(chunk.data(), got);
    }
  } catch (const std::bad_alloc&) {
    const size_t read = out.size();
    out.clear();
    out.shrink_to_fit();
    if (why)
      *why = "does not fit in memory (" + byteCount(read) + " read)";
    return false;
  }
  if (in.bad()) {
    out.clear();
    if (why)
      *why = errorWhat;
    return false;
  }
  return true;
}

} // namespace

void adviseHugePages(const void* p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin)
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE); // advice: may fail
#else
  (void)p;
  (void)bytes;
#endif
}

void parallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& f) {
  const size_t pieces = std::max<size_t>(
      1, std::min<size_t>(std::thread::hardware_concurrency(), n / std::max<size_t>(grain, 1)));
  if (pieces <= 1) {
    f(0, n);
    return;
  }
  std::vector<std::thread> threads;
  for (size_t i = 1; i < pieces; ++i)
    threads.emplace_back(f, n * i / pieces, n * (i + 1) / pieces);
  f(0, n / pieces);
  for (std::thread& t : threads)
    t.join();
}

bool readFile(const std::string& path, std::string& out, std::string* why, size_t maxBytes) {
  out.clear();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (why)
      *why = "is a directory";
    return false;
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (why)
      *why = errno ? std::strerror(errno) : "cannot be opened";
    if (why && !why->empty())
      (*why)[0] = static_cast<char>(std::tolower(static_cast<unsigned char>((*why)[0])));
    return false;
  }
  // Regular files are read in one piece into a buffer of their size (models are hundreds of
  // MB: growing a stream buffer would copy them several times); others (pipes, devices) as a
  // stream, in chunks, up to the limit.
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && std::filesystem::is_regular_file(path, ec)) {
    if (size > maxBytes) {
      if (why)
        *why = "is " + byteCount(static_cast<size_t>(size)) + ", longer than " +
               byteCount(maxBytes) + ", the most fpat reads";
      return false;
    }
    try {
      out.reserve(static_cast<size_t>(size));
      adviseHugePages(out.data(), static_cast<size_t>(size));
      out.resize(static_cast<size_t>(size));
    } catch (const std::bad_alloc&) {
      if (why)
        *why = "does not fit in memory (" + byteCount(static_cast<size_t>(size)) + ")";
      return false;
    }
    in.read(out.data(), static_cast<std::streamsize>(size));
    if (in.gcount() == static_cast<std::streamsize>(size) && in.peek() == EOF)
      return true;
    in.clear();
    in.seekg(0);
    out.clear();
  }
  return readStream(in, out, why, std::min(maxBytes, kMaxStreamBytes), "read error");
}

bool readInput(const std::string& path, std::string& out, std::string* why, size_t maxBytes) {
  if (path != "-")
    return readFile(path, out, why, maxBytes);
  return readStream(std::cin, out, why, std::min(maxBytes, kMaxStreamBytes),
                    "read error on standard input");
}

} // namespace fpat
