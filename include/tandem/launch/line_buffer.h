#pragma once
// Cuts a worker's output stream into whole lines, so the launcher can prefix each with the rank and lines of
// different ranks never interleave mid-line.
//
// A line redrawn in place (a progress bar: each state starts with '\r') is passed on as it stands whenever a
// chunk of output ends inside it, marked partial: a terminal shows it until the next state replaces it, a log
// keeps only the state its '\n' completes.
#include <cstddef>
#include <functional>
#include <string>

namespace tandem::launch {

class LineBuffer {
 public:
  // A line longer than this is passed on in pieces rather than held without bound.
  static constexpr size_t kMaxLine = 64 * 1024;

  // `line` without its '\n' or '\r'; `partial`: the state of a line still being redrawn.
  using LineSink = std::function<void(const std::string& line, bool partial)>;

  // Calls `sink` with every line completed by `data`, then with the redrawn line's state, if `data` ended
  // inside one. "text\r\n" is the line "text".
  void feed(const char* data, size_t size, const LineSink& sink);
  // Passes on a last line that had no '\n' (the stream ended); does nothing when nothing is pending.
  void flush(const LineSink& sink);

 private:
  void complete(const LineSink& sink);

  std::string pending_;
  std::string redrawn_;    // the line's state before its latest '\r'
  bool redrawing_ = false; // the current line has had a '\r'
};

}  // namespace tandem::launch
