#include "tandem/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "tandem/util/log.h"

namespace tandem::train {
namespace {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  const long total = static_cast<long>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof text, "%02ld:%02ld", total / 60, total % 60);
  }
  return text;
}

}  // namespace

ProgressReporter::ProgressReporter(int64_t batches_per_epoch, int64_t samples_per_batch_all_ranks,
                                   ProgressOptions options)
    : batches_per_epoch_(std::max<int64_t>(1, batches_per_epoch)),
      samples_per_batch_(samples_per_batch_all_ranks),
      options_(options),
      end_batch_(batches_per_epoch_) {
  if (options_.terminal >= 0) {
    terminal_ = options_.terminal == 1;
  } else {
    const char* shown_on_terminal = std::getenv("TANDEM_TERMINAL");
    terminal_ = ::isatty(::fileno(options_.out)) == 1 || (shown_on_terminal && std::string(shown_on_terminal) == "1");
  }
}

void ProgressReporter::start_epoch(int epoch, int64_t first_batch, int64_t batches_to_train, int64_t epoch_batches) {
  epoch_ = epoch;
  first_batch_ = first_batch;
  const int64_t batches = epoch_batches > 0 ? epoch_batches : batches_per_epoch_;
  end_batch_ = batches_to_train > 0 ? std::min(batches, first_batch + batches_to_train) : batches;
  last_printed_ = -1;
  start_ = std::chrono::steady_clock::now();
  last_draw_.reset();
}

void ProgressReporter::update(int64_t batch, double mean_loss) {
  if (!options_.enabled) return;
  const int64_t done = batch + 1;
  if (terminal_) {
    // Redrawing costs a write per step; ten times a second is enough for a person.
    const auto now = std::chrono::steady_clock::now();
    if (last_draw_ && done < end_batch_ && now - *last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw(done, mean_loss);
    return;
  }
  const int64_t every = std::max<int64_t>(1, end_batch_ / std::max(1, options_.lines_per_epoch));
  if (done % every == 0 || done == end_batch_) draw(done, mean_loss);
}

void ProgressReporter::end_epoch() {
  if (options_.enabled && terminal_) {
    std::fputc('\n', options_.out);
    std::fflush(options_.out);
  }
}

void ProgressReporter::draw(int64_t done, double mean_loss) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done_here = done - first_batch_;
  const double rate = elapsed > 0 ? done_here * samples_per_batch_ / elapsed : 0;
  const double eta = done_here > 0 ? elapsed / done_here * (end_batch_ - done) : -1;
  if (terminal_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * done / end_batch_);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(options_.out, "\r[epoch %d] [%s] %lld/%lld loss %.4f %.0f samples/s ETA %s ", epoch_, bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(end_batch_), mean_loss, rate,
                 format_duration(eta).c_str());
    std::fflush(options_.out);
  } else {
    log::write("", fmt::format("[epoch {}] batch {}/{} loss {:.4f} {:.0f} samples/s ETA {}", epoch_, done,
                               end_batch_, mean_loss, rate, format_duration(eta)));
  }
  last_printed_ = done;
}

}  // namespace tandem::train
