// The end of the Run's epochs (train/run.h): evaluation on the test set sharded across the ranks, the epoch's
// metrics line and records, and the report at the end of the run.
#include <fmt/format.h>

#include <cstdio>

#include "run.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/comm/value_collectives.h"
#include "tandem/train/evaluation.h"
#include "tandem/util/log.h"

namespace tandem::train {

EpochMetrics Run::evaluate_epoch(int epoch, const EpochProgress& progress) {
  EpochMetrics m;
  m.epoch = epoch;
  m.loss = progress.steps > 0 ? progress.loss_sum / progress.steps : 0.0;
  m.lr = optimizer_.param_groups()[0].options().get_lr();
  // The slowest rank's time is the epoch's, and every rank reports the same metrics.
  torch::Tensor seconds = torch::tensor({progress.seconds}, torch::kFloat64);
  if (communicator_ && world_ > 1) comm::all_reduce_values(*communicator_, seconds, comm::ReduceOp::Max);
  m.train_seconds = seconds.item<double>();
  m.samples_per_second = m.train_seconds > 0 ? progress.samples / m.train_seconds : 0.0;
  m.step = step_;
  strategy_->before_evaluation();
  if (eval_loader_) {
    module_.eval();
    const auto forward = [&](const torch::Tensor& x) {
      return in_precision([&] { return strategy_->evaluation_forward(x); });
    };
    const EvalCounts counts = evaluate(forward, *eval_loader_, epoch, communicator_);
    m.accuracy = counts.accuracy();
    m.correct = counts.correct;
    m.total = counts.total;
  }
  comm::run_on_all_ranks(communicator_, "to write metrics.jsonl", [&] {
    if (!is_main_) return;
    const std::string accuracy = eval_loader_ ? fmt::format(" accuracy {:.4f}", m.accuracy) : "";
    std::printf("[epoch %d] loss %.4f%s lr %s\n", epoch, m.loss, accuracy.c_str(), fmt::format("{:.6g}", m.lr).c_str());
    std::fflush(stdout);
    records_->record_epoch(m);
  });
  if (callbacks_.on_epoch_end) {
    comm::run_on_all_ranks(communicator_, "in on_epoch_end", [&] {
      callbacks_.on_epoch_end(m);
      strategy_->after_user_code();
    });
  }
  return m;
}

// The training is done and saved by now: a report that cannot be drawn is worth a line, not a failed run.
void Run::write_report() {
  if (!is_main_) return;
  try {
    log::main_info("report: {}", records_->write_report());
  } catch (const std::exception& error) {
    log::main_info("no report written: {}", error.what());
  }
}

}  // namespace tandem::train
