#include "tandem/train/run_recorder.h"

#include "tandem/monitor/report.h"
#include "tandem/monitor/run_records.h"
#include "tandem/util/atomic_file.h"

namespace tandem::train {
namespace {

// A run dir may sit in a shared writable folder: a link planted under a record's name would make its
// JsonLinesFile rewrite or append to the link's target, so it is refused before the file is opened.
std::string record_file(const std::string& run_dir, const std::string& name) {
  const std::string path = run_dir + "/" + name;
  refuse_symbolic_link(path);
  return path;
}

}  // namespace

RunRecorder::RunRecorder(const std::string& run_dir, int resumed_epoch, int64_t resumed_step, RunRecorderOptions options)
    : run_dir_(run_dir),
      options_(options),
      epochs_(record_file(run_dir, "metrics.jsonl"), "epoch", resumed_epoch),
      steps_(record_file(run_dir, "steps.jsonl"), "step", resumed_step + 1) {
  if (!options_.tensorboard) return;
  tensorboard_ = std::make_unique<monitor::SummaryWriter>(run_dir);
  // TensorBoard must forget what the jsonl files just dropped. Besides the steps after the checkpoint, that is
  // the line of an epoch that a --steps stop ended early, at the checkpoint's own step: so the START purges from
  // that step on (also for a new run, at 0: a run dir reused without a checkpoint may hold an earlier run's
  // events), and what the files keep at that step is written again.
  tensorboard_->add_session_start(resumed_step);
  if (resumed_step > 0) rewrite_tensorboard_at(resumed_step);
}

void RunRecorder::rewrite_tensorboard_at(int64_t step) {
  std::vector<std::string> notes;  // the files were just rewritten whole: nothing is left out
  for (const monitor::StepRecord& record : monitor::read_step_records(run_dir_ + "/steps.jsonl", notes)) {
    if (record.step == step) add_step_scalars(record.step, record.loss, record.lr);
  }
  for (const monitor::EpochRecord& record : monitor::read_epoch_records(run_dir_ + "/metrics.jsonl", notes)) {
    if (record.step == step) {
      add_epoch_scalars(record.epoch, record.step, record.loss, record.accuracy.value_or(0.0), record.lr,
                        record.samples_per_second);
    }
  }
}

void RunRecorder::record_step(const StepMetrics& m) noexcept {
  if (step_failure_) return;
  try {
    steps_.append(to_json_line(m));
    if (tensorboard_) add_step_scalars(m.step, m.loss, m.lr);
  } catch (...) {
    step_failure_ = std::current_exception();
  }
}

void RunRecorder::record_epoch(const EpochMetrics& m) {
  if (step_failure_) std::rethrow_exception(step_failure_);
  epochs_.append(to_json_line(m));
  if (tensorboard_) add_epoch_scalars(m.epoch, m.step, m.loss, m.accuracy, m.lr, m.samples_per_second);
}

void RunRecorder::add_step_scalars(int64_t step, double loss, double lr) {
  tensorboard_->add_scalar("step/loss", loss, step);
  tensorboard_->add_scalar("step/learning_rate", lr, step);
}

void RunRecorder::add_epoch_scalars(int epoch, int64_t step, double loss, double accuracy, double lr,
                                    double samples_per_second) {
  tensorboard_->add_scalar("loss", loss, step);
  if (options_.has_eval_set) tensorboard_->add_scalar("accuracy", accuracy, step);
  tensorboard_->add_scalar("learning_rate", lr, step);
  tensorboard_->add_scalar("samples_per_second", samples_per_second, step);
  tensorboard_->add_scalar("epoch", epoch, step);
}

std::string RunRecorder::write_report() {
  const std::string path = monitor::default_report_path(run_dir_);
  monitor::write_report(run_dir_, path);
  return path;
}

}  // namespace tandem::train
