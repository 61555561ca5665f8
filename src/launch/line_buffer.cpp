#include "tandem/launch/line_buffer.h"

#include <cstring>

namespace tandem::launch {

void LineBuffer::feed(const char* data, size_t size, const LineSink& sink) {
  const char* end = data + size;
  while (data < end) {
    const char* newline = static_cast<const char*>(std::memchr(data, '\n', static_cast<size_t>(end - data)));
    const char* stop = newline != nullptr ? newline : end;
    pending_.append(data, static_cast<size_t>(stop - data));
    if (newline != nullptr) {
      sink(pending_);
      pending_.clear();
      data = newline + 1;
    } else {
      data = end;
    }
    while (pending_.size() >= kMaxLine) {
      sink(pending_.substr(0, kMaxLine));
      pending_.erase(0, kMaxLine);
    }
  }
}

void LineBuffer::flush(const LineSink& sink) {
  if (pending_.empty()) return;
  sink(pending_);
  pending_.clear();
}

}  // namespace tandem::launch
