#include "tandem/launch/line_buffer.h"

#include <algorithm>

namespace tandem::launch {

void LineBuffer::feed(const char* data, size_t size, const LineSink& sink) {
  const char* end = data + size;
  while (data < end) {
    const char* stop = std::find_if(data, end, [](char c) { return c == '\n' || c == '\r'; });
    pending_.append(data, static_cast<size_t>(stop - data));
    if (stop == end) {
      data = end;
    } else if (*stop == '\n') {
      complete(sink);
      data = stop + 1;
    } else {
      // Back to the line's start: what follows replaces it. "text\r\n" keeps "text" (see complete).
      if (!pending_.empty()) redrawn_ = std::move(pending_);
      pending_.clear();
      redrawing_ = true;
      data = stop + 1;
    }
    while (pending_.size() >= kMaxLine) {
      sink(pending_.substr(0, kMaxLine), false);
      pending_.erase(0, kMaxLine);
    }
  }
  if (redrawing_ && !pending_.empty()) sink(pending_, true);
}

void LineBuffer::complete(const LineSink& sink) {
  sink(pending_.empty() && redrawing_ ? redrawn_ : pending_, false);
  pending_.clear();
  redrawn_.clear();
  redrawing_ = false;
}

void LineBuffer::flush(const LineSink& sink) {
  if (pending_.empty() && !redrawing_) return;
  complete(sink);
}

}  // namespace tandem::launch
