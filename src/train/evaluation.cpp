#include "tandem/train/evaluation.h"

#include "tandem/comm/value_collectives.h"

namespace tandem::train {

EvalCounts evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& forward, data::BatchLoader& loader,
                    int64_t epoch, comm::Communicator* communicator) {
  torch::NoGradGuard no_grad;
  torch::Tensor correct;  // on the model's device, read once at the end rather than once per batch
  int64_t total = 0;
  loader.start_epoch(epoch);
  while (std::optional<data::Batch> batch = loader.next()) {
    // Every rank runs the same number of forwards, even on a batch that is all padding or, under
    // --skip-bad-images, empty: a model whose forward communicates (FSDP gathers each unit) would otherwise wait
    // for a rank that skipped it. The padding is dropped afterwards.
    const int64_t real = batch->real_count();
    torch::Tensor predicted = forward(batch->data).argmax(1).slice(0, 0, real);
    torch::Tensor hits = predicted.eq(batch->target.slice(0, 0, real)).sum();
    correct = correct.defined() ? correct + hits : hits;
    total += real;
  }
  // float64 holds counts exactly up to 2^53; every backend reduces it.
  torch::Tensor counts = torch::tensor({correct.defined() ? correct.item<double>() : 0.0, static_cast<double>(total)},
                                       torch::kFloat64);
  if (communicator && communicator->world_size() > 1) comm::all_reduce_values(*communicator, counts, comm::ReduceOp::Sum);
  return {static_cast<int64_t>(counts[0].item<double>()), static_cast<int64_t>(counts[1].item<double>())};
}

}  // namespace tandem::train
