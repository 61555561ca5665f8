#pragma once
// Per-epoch results of a run, one JSON object per line in RUN_DIR/metrics.jsonl (written by rank 0), e.g.
//   {"epoch":0,"loss":0.61,"accuracy":0.853,"correct":8530,"total":10000,"lr":0.02,"samples_per_second":9100,...}
// Lines are appended and flushed as each epoch ends, so a crashed run keeps every finished epoch; a resumed run
// continues the same file from the epoch it resumes.
#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem::train {

struct EpochMetrics {
  int epoch = 0;
  double loss = 0;      // mean training loss over the epoch's steps, averaged across ranks
  double accuracy = 0;  // correct / total on the test split
  int64_t correct = 0;
  int64_t total = 0;    // test samples counted: each exactly once, padding excluded
  double lr = 0;        // the learning rate this epoch trained with
  double samples_per_second = 0;  // training samples over all ranks / training wall time
  double train_seconds = 0;
  int64_t step = 0;     // optimizer steps since the start of the run, at the end of the epoch
};

std::string to_json_line(const EpochMetrics& metrics);

class MetricsWriter {
 public:
  // Opens `path` for appending, after dropping its lines for epochs from `first_epoch` on, and any torn line:
  // the run trains those epochs now, and such lines come from a run killed before its checkpoint. Throws
  // Error naming the file if it cannot be rewritten or opened.
  MetricsWriter(const std::string& path, int first_epoch);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const EpochMetrics& metrics);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tandem::train
