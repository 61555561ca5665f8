#include "tandem/train/run_recorder.h"

#include "tandem/monitor/report.h"

namespace tandem::train {

RunRecorder::RunRecorder(const std::string& run_dir, int resumed_epoch, int64_t resumed_step, RunRecorderOptions options)
    : run_dir_(run_dir),
      options_(options),
      epochs_(run_dir + "/metrics.jsonl", "epoch", resumed_epoch),
      steps_(run_dir + "/steps.jsonl", "step", resumed_step + 1) {
  if (!options_.tensorboard) return;
  tensorboard_ = std::make_unique<monitor::SummaryWriter>(run_dir);
  // Also for a new run (step 1): a run dir reused without a checkpoint may hold an earlier run's events, and
  // TensorBoard must forget them as metrics.jsonl and steps.jsonl do.
  tensorboard_->add_session_start(resumed_step + 1);
}

void RunRecorder::record_step(const StepMetrics& m) noexcept {
  if (step_failure_) return;
  try {
    steps_.append(to_json_line(m));
    if (!tensorboard_) return;
    tensorboard_->add_scalar("step/loss", m.loss, m.step);
    tensorboard_->add_scalar("step/learning_rate", m.lr, m.step);
  } catch (...) {
    step_failure_ = std::current_exception();
  }
}

void RunRecorder::record_epoch(const EpochMetrics& m) {
  if (step_failure_) std::rethrow_exception(step_failure_);
  epochs_.append(to_json_line(m));
  if (!tensorboard_) return;
  tensorboard_->add_scalar("loss", m.loss, m.step);
  if (options_.has_eval_set) tensorboard_->add_scalar("accuracy", m.accuracy, m.step);
  tensorboard_->add_scalar("learning_rate", m.lr, m.step);
  tensorboard_->add_scalar("samples_per_second", m.samples_per_second, m.step);
  tensorboard_->add_scalar("epoch", m.epoch, m.step);
}

std::string RunRecorder::write_report() {
  const std::string path = monitor::default_report_path(run_dir_);
  monitor::write_report(run_dir_, path);
  return path;
}

}  // namespace tandem::train
