#pragma once
// The one line that main.cpp prints for an exception that ends the program. LibTorch's c10::Error holds a C++
// backtrace in what() ("Exception raised from ... (most recent call first):" and a "frame #N" line per frame),
// which is for LibTorch's developers, not for the user of a program: the line takes its
// what_without_backtrace() (LibTorch 1.13 and 2.x both have it), cuts off a backtrace that a tandem error
// copied from a LibTorch one it wraps, and joins what is left into one line.
#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "apps/option_names.h"

namespace tandem::app {

// LibTorch's refusals that a wrong setting of the program causes, as what to change: LibTorch names its own
// arguments, which the user never gave.
inline std::string with_remedy(const std::string& line) {
  // torch::nn::functional::batch_norm's check, met by a BatchNorm layer in training mode on a batch of one
  // sample per rank (--batch-size 1, or the last batch of an epoch under --uneven).
  static const std::string kOneValuePerChannel = "Expected more than 1 value per channel when training, got input size ";
  const size_t at = line.find(kOneValuePerChannel);
  if (at == std::string::npos) return line;
  return "a batch of 1 sample per rank reached a BatchNorm layer in training mode, whose statistics need more "
         "than one value per channel (its input was " +
         line.substr(at + kOneValuePerChannel.size()) +
         "); use a batch size of 2 or more per rank, or a model without BatchNorm";
}

// `error`'s message as one line, with the library's option names written as the program's flags
// (option_names.h).
inline std::string error_line(const std::exception& error) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
  std::string text = torch_error != nullptr ? torch_error->what_without_backtrace() : error.what();
  for (const char* backtrace_start : {"\nException raised from", "\nframe #"}) {
    const size_t at = text.find(backtrace_start);
    if (at != std::string::npos) text.erase(at);
  }
  // A c10::Error with several contexts puts each on a line of its own ("\n  context").
  std::string line;
  for (size_t at = 0; at < text.size(); ++at) {
    if (text[at] != '\n') {
      line += text[at];
      continue;
    }
    while (at + 1 < text.size() && text[at + 1] == ' ') ++at;
    if (at + 1 < text.size()) line += "; ";
  }
  return with_flag_names(with_remedy(line));
}

}  // namespace tandem::app
