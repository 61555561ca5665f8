#pragma once
// Cuts a worker's output stream into whole lines, so the launcher can prefix each with the rank and lines of
// different ranks never interleave mid-line.
#include <cstddef>
#include <functional>
#include <string>

namespace tandem::launch {

class LineBuffer {
 public:
  // A line longer than this is passed on in pieces rather than held without bound (progress bars that only
  // ever print '\r').
  static constexpr size_t kMaxLine = 64 * 1024;

  using LineSink = std::function<void(const std::string& line)>;

  // Calls `sink` with every line completed by `data`, without its '\n'.
  void feed(const char* data, size_t size, const LineSink& sink);
  // Passes on a last line that had no '\n' (the stream ended); does nothing when nothing is pending.
  void flush(const LineSink& sink);

 private:
  std::string pending_;
};

}  // namespace tandem::launch
