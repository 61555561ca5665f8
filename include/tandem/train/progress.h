#pragma once
// Rank 0's view of training progress. On a terminal: one bar redrawn in place ('\r'), at the epoch's first and
// last batch and at most ten times a second between,
//   [epoch 2] [#########...............] 412/937 loss 0.4123 9123 samples/s ETA 00:05
// Otherwise (a log file, CI): a plain line about every tenth of an epoch, with no '\r' or escape codes, so logs
// stay short and readable:
//   [epoch 2] batch 412/937 loss 0.4123 9123 samples/s ETA 00:05
// Epochs are numbered from 0, as in the "[epoch 2] loss ... accuracy ..." line that ends each epoch and in
// metrics.jsonl; a checkpoint's name holds the epoch it continues (checkpoint-0001-00000000 after epoch 0). An epoch that the run will stop inside (max_steps) counts to where it
// stops, "250/250", so that its ETA is the time to that stop. Other ranks construct it disabled and it prints
// nothing.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>

namespace tandem::train {

struct ProgressOptions {
  bool enabled = true;              // false on ranks other than 0
  std::FILE* out = stderr;
  int lines_per_epoch = 10;         // plain mode only
  // -1: detect: a terminal when isatty(out), or when TANDEM_TERMINAL=1 (tandem run sets it for workers whose
  // output it shows on a terminal); 0/1 force plain/bar.
  int terminal = -1;
};

class ProgressReporter {
 public:
  ProgressReporter(int64_t batches_per_epoch, int64_t samples_per_batch_all_ranks,
                   ProgressOptions options = {});

  // Starts timing an epoch that begins at batch `first_batch` (non-zero after a mid-epoch resume). The run trains
  // at most `batches_to_train` batches of it from there (0: to the epoch's end), when max_steps stops it early.
  // `epoch_batches` > 0 replaces batches_per_epoch for this epoch: one continued on another world size or batch
  // size counts the batches before the resume and this layout's after it.
  void start_epoch(int epoch, int64_t first_batch = 0, int64_t batches_to_train = 0, int64_t epoch_batches = 0);
  // After batch `batch` (0-based) of the current epoch, with the running mean loss across ranks.
  void update(int64_t batch, double mean_loss);
  // Ends the bar's line (terminal mode).
  void end_epoch();

 private:
  void draw(int64_t done, double mean_loss);

  int64_t batches_per_epoch_;
  int64_t samples_per_batch_;
  ProgressOptions options_;
  bool terminal_ = false;
  int epoch_ = 0;
  int64_t first_batch_ = 0;
  int64_t end_batch_ = 0;  // where this epoch's training ends: batches_per_epoch_, or earlier at a max_steps stop
  int64_t last_printed_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> last_draw_;  // none yet in this epoch
};

}  // namespace tandem::train
