#pragma once
// What a finished (or killed) run left in its run directory, read back for the report. The files and their
// fields are those rank 0 writes during training (docs/report.md lists them):
//   metrics.jsonl          one line per epoch; the only file every run has
//   steps.jsonl            one line per optimizer step (older runs lack it)
//   timeline_summary.json  means per step over the timeline's window (runs with --timeline)
// A killed run may leave a torn last line in a .jsonl file: it is left out, with a note. A resumed run may
// repeat the epochs or steps after its checkpoint: the later line wins, as it is the one the run continued from.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/monitor/timeline_summary.h"

namespace tandem::monitor {

// One line of metrics.jsonl. Numbers a run could not compute (a NaN loss, written as null) read as NaN.
struct EpochRecord {
  int epoch = 0;  // 0-based
  double loss = 0;
  std::optional<double> accuracy;  // absent when the run had no test set (the line's total is 0)
  double lr = 0;
  double samples_per_second = 0;
  double train_seconds = 0;
  int64_t step = 0;  // optimizer steps since the run's start, at the end of the epoch
};

// One line of steps.jsonl.
struct StepRecord {
  int64_t step = 0;  // 1-based count of optimizer steps, this one included
  int epoch = 0;
  double loss = 0;  // averaged over the ranks
  double lr = 0;
  double seconds = 0;  // rank 0's wall time for the whole step
  double samples_per_second = 0;
  std::vector<double> rank_seconds;  // rank r's time from its step's start to the loss all-reduce
};

struct RunRecords {
  std::string run_dir;
  std::vector<EpochRecord> epochs;  // ordered by epoch
  std::vector<StepRecord> steps;    // ordered by step; empty without steps.jsonl
  std::optional<TimelineSummary> timeline;
  // What the reader left out or did not find, in words for the report ("steps.jsonl not found: ...").
  std::vector<std::string> notes;
};

// Reads the run directory's records. Throws InvalidArgument naming the file when metrics.jsonl is missing, or
// when any of the files holds a line (other than a torn last line) that is not the JSON the run writes.
RunRecords read_run_records(const std::string& run_dir);

// One file's records, read as read_run_records reads them; what it leaves out goes to `notes`. A file that does
// not exist holds none.
std::vector<EpochRecord> read_epoch_records(const std::string& metrics_jsonl, std::vector<std::string>& notes);
std::vector<StepRecord> read_step_records(const std::string& steps_jsonl, std::vector<std::string>& notes);

}  // namespace tandem::monitor
