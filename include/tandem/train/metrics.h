#pragma once
// The results of a run, as rank 0 appends them to RUN_DIR: one JSON object per line, per epoch in metrics.jsonl
//   {"epoch":0,"loss":0.61,"accuracy":0.853,"correct":8530,"total":10000,"lr":0.02,"samples_per_second":9100,...}
// (accuracy, correct and total only where the epoch was evaluated: a run without an evaluation set has none)
// and per optimizer step in steps.jsonl
//   {"step":12,"epoch":0,"batch":11,"loss":0.73,"lr":0.02,"loss_scale":1,"optimizer_stepped":true,...}
// Lines are flushed as they are written, so a crashed run keeps every finished epoch and step; a resumed run
// continues the same files from where its checkpoint stands.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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

struct StepMetrics {
  int64_t step = 0;   // optimizer steps since the start of the run, this one included (1 for the first)
  int epoch = 0;
  int64_t batch = 0;  // 0-based, within the epoch
  double loss = 0;    // averaged over the ranks
  double lr = 0;
  double loss_scale = 1;          // the GradScaler's scale after the step; 1 without one
  bool optimizer_stepped = true;  // false: the scaler skipped the step (an inf or NaN gradient)
  double seconds = 0;             // rank 0's wall time for the whole step
  double samples_per_second = 0;  // the step's samples over all ranks / seconds
  int64_t samples = 0;            // the step's samples over all ranks
  int world_size = 1;             // the ranks that trained the step (in-job recovery changes it during a run)
  double time = 0;                // when rank 0 ended the step: seconds since the Unix epoch
  // Per rank: from the start of its step until it reached the step's loss all-reduce, so forward, backward
  // and the gradient all-reduce; a straggler shows here.
  std::vector<double> rank_seconds;
};

std::string to_json_line(const EpochMetrics& metrics);
std::string to_json_line(const StepMetrics& metrics);

// An append-only file of JSON lines, each numbered by the integer field `key` ("epoch", "step").
class JsonLinesFile {
 public:
  // Opens `path` for appending, after dropping its lines whose `key` is `first_dropped` or more, and any torn
  // line: the run writes those records again now, and such lines come from a run killed after its last
  // checkpoint. Throws Error naming the file if it cannot be rewritten or opened.
  JsonLinesFile(std::string path, const std::string& key, int64_t first_dropped);
  ~JsonLinesFile();
  JsonLinesFile(const JsonLinesFile&) = delete;
  JsonLinesFile& operator=(const JsonLinesFile&) = delete;

  // Appends `json_line` (one JSON object, no newline) and flushes it.
  void append(const std::string& json_line);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tandem::train
