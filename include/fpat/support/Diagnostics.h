// Source buffers, locations and the one diagnostic engine every fpat front end reports through.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace fpat {

/// A position in a source buffer: 1-based line and column (in bytes), plus the length of the
/// range to underline. `file < 0` means "no location".
struct SourceLoc {
  int file = -1;
  int line = 0;
  int col = 0;
  int len = 1;
  bool valid() const { return file >= 0 && line > 0; }
};

struct SourceFile {
  std::string name;
  std::string text;
  std::vector<size_t> lineStarts; // byte offset of each line
};

/// Owns every buffer read during a run so that diagnostics can quote source lines.
class SourceManager {
public:
  int addBuffer(std::string name, std::string text);
  const SourceFile& file(int id) const { return files_.at(static_cast<size_t>(id)); }
  int numFiles() const { return static_cast<int>(files_.size()); }
  /// The text of `line` (1-based) without its newline; empty when out of range.
  std::string_view lineText(int fileId, int line) const;
  /// Location of a byte offset within a buffer.
  SourceLoc locForOffset(int fileId, size_t offset, int len = 1) const;

private:
  std::vector<SourceFile> files_;
};

enum class Severity { Error, Warning, Note };

struct DiagNote {
  SourceLoc loc;
  std::string message;
};

struct Diagnostic {
  Severity severity = Severity::Error;
  SourceLoc loc;
  std::string message;
  std::vector<DiagNote> notes;
};

/// Collects diagnostics, prints them clang-style (`file:line:col: error: message`, the source
/// line and a caret) and counts errors. Printing is optional so that tests can inspect the
/// structured list instead.
class DiagEngine {
public:
  explicit DiagEngine(const SourceManager& sm, std::ostream* out = nullptr) : sm_(sm), out_(out) {}

  /// Reports a diagnostic; notes may be attached with `note()` before the next report.
  void error(SourceLoc loc, std::string message) {
    report(Severity::Error, loc, std::move(message));
  }
  void warning(SourceLoc loc, std::string message) {
    report(Severity::Warning, loc, std::move(message));
  }
  /// Attaches a note to the most recent error or warning.
  void note(SourceLoc loc, std::string message);

  /// Prints everything reported so far that has not been printed yet (notes included).
  void flush();

  int errorCount() const { return errors_; }
  int warningCount() const { return warnings_; }
  bool hasErrors() const { return errors_ > 0; }
  /// True once the error limit is reached; front ends stop early then.
  bool limitReached() const { return errorLimit_ > 0 && errors_ >= errorLimit_; }
  void setErrorLimit(int limit) { errorLimit_ = limit; }
  void setWarningsAsErrors(bool on) { werror_ = on; }
  const std::vector<Diagnostic>& diagnostics() const { return diags_; }
  const SourceManager& sources() const { return sm_; }

  /// Renders one diagnostic (with its notes) exactly as it is printed.
  std::string render(const Diagnostic& d) const;

private:
  void report(Severity sev, SourceLoc loc, std::string message);
  std::string renderOne(Severity sev, const SourceLoc& loc, const std::string& msg) const;

  const SourceManager& sm_;
  std::ostream* out_;
  std::vector<Diagnostic> diags_;
  size_t printed_ = 0;
  int errors_ = 0;
  int warnings_ = 0;
  int errorLimit_ = 0;
  bool werror_ = false;
  bool limitNoted_ = false;
};

const char* severityName(Severity s);

/// Checks that `text` is valid UTF-8; on failure returns false and the offset of the first
/// bad byte. ANTLR's runtime throws on malformed UTF-8, so front ends check first.
bool validateUtf8(std::string_view text, size_t* badOffset);

/// Shortest decimal form of `v` that parses back to the same double (for round trips).
std::string formatDouble(double v);

/// The candidate closest to `word` by edit distance, if it is close enough to be a likely typo
/// (at most a third of the word's length, at least 1); "" otherwise. For did-you-mean notes.
std::string closestMatch(std::string_view word, const std::vector<std::string>& candidates);
/// " (did you mean 'x'?)" for closestMatch's answer, or "".
std::string didYouMean(std::string_view word, const std::vector<std::string>& candidates);

/// A source file's name as generated code may mention it: relative names as given, absolute
/// ones by their last component (generated code must not depend on where files live).
std::string displayPath(const std::string& path);

/// The most any file is read to: 2 GiB, the most a protobuf message (an ONNX model without
/// external data) can hold; a .fgraph of a million ops is about 60 MB.
inline constexpr size_t kMaxInputBytes = size_t{2} << 30;
/// The most a pipe or device is read to: streams that never end (/dev/zero, `yes |`) stop here
/// with an error, in about a second, not at the end of memory.
inline constexpr size_t kMaxStreamBytes = size_t{256} << 20;

/// Reads a whole file; returns false (and leaves `out` empty) when it cannot be read, with the
/// reason ("no such file or directory", "is a directory", "is longer than ...") in `why` if
/// given. At most `maxBytes` are read (of a pipe or device at most kMaxStreamBytes): a file or
/// stream longer than that is an error.
bool readFile(const std::string& path, std::string& out, std::string* why = nullptr,
              size_t maxBytes = kMaxInputBytes);
/// Asks the kernel to back [p, p + bytes) with huge pages before it is first written (Linux,
/// transparent huge pages in "madvise" mode): a model's weights are hundreds of MB, and their
/// 4 KB page faults took a third of an import. A no-op elsewhere or for small buffers.
void adviseHugePages(const void* p, size_t bytes);
/// Calls f(begin, end) over [0, n) split into about as many pieces as the machine has cores
/// (one piece below `grain` items), and waits for all of them.
void parallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& f);
/// readFile, where "-" means standard input (the tools' convention).
bool readInput(const std::string& path, std::string& out, std::string* why = nullptr,
               size_t maxBytes = kMaxInputBytes);
/// How diagnostics name an input: "<stdin>" for "-", else the path.
inline std::string inputName(const std::string& path) {
  return path == "-" ? "<stdin>" : path;
}

} // namespace fpat
