#pragma once
// What rank 0 writes into the run directory as training goes (docs/monitoring.md): metrics.jsonl per epoch
// and steps.jsonl per step (train/metrics.h), the same scalars as a TensorBoard event file, and, at the end,
// report.html drawn from them (monitor/report.h).
//
// TensorBoard's x axis is the optimizer step for every tag, the epoch's scalars at the step that ended the
// epoch: a resumed run can then tell TensorBoard to forget what the killed run wrote from its checkpoint's step
// on (a SessionLog START), which a mix of epoch and step axes would not allow, and so show what metrics.jsonl
// and steps.jsonl keep, no more.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "tandem/monitor/summary_writer.h"
#include "tandem/train/metrics.h"

namespace tandem::train {

struct RunRecorderOptions {
  bool tensorboard = true;
  bool has_eval_set = true;  // whether epochs have an accuracy to record
};

class RunRecorder {
 public:
  // Opens the run's files to continue after `resumed_epoch` epochs and `resumed_step` steps (0, 0: a new run).
  // Throws Error naming a file that cannot be written, or that is a symbolic link (never written through).
  RunRecorder(const std::string& run_dir, int resumed_epoch, int64_t resumed_step, RunRecorderOptions options);

  // Called inside a step, where a throw on rank 0 alone would leave the other ranks waiting in their next
  // collective: a failure to write is kept and thrown by the next record_epoch instead, which every rank reaches
  // together.
  void record_step(const StepMetrics& metrics) noexcept;
  void record_epoch(const EpochMetrics& metrics);
  // RUN_DIR/report.html from everything recorded so far, and earlier runs' records in the directory.
  std::string write_report();

 private:
  // After the SessionLog START at `step`: the scalars the jsonl files keep at that step, again.
  void rewrite_tensorboard_at(int64_t step);
  void add_step_scalars(int64_t step, double loss, double lr);
  void add_epoch_scalars(int epoch, int64_t step, double loss, double accuracy, double lr, double samples_per_second);

  std::string run_dir_;
  RunRecorderOptions options_;
  JsonLinesFile epochs_;
  JsonLinesFile steps_;
  std::unique_ptr<monitor::SummaryWriter> tensorboard_;
  std::exception_ptr step_failure_;
};

}  // namespace tandem::train
