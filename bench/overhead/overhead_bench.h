#pragma once
// The host's overhead per training step, behind `tandem bench overhead`: a model so small that its kernels take
// next to nothing (a 32-32-10 MLP, batch 8, SGD with momentum, one thread), so that a step's time is what the
// framework adds around them: autograd's bookkeeping, the optimizer's loop and, under DDP, the reducer's hooks,
// its buckets and the gradient all-reduce. One process runs it alone (no DDP) or as one rank of a DDP job, at any
// world size, 1 included (DDP with nobody to talk to: its fixed cost alone).
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::bench {

struct OverheadBenchOptions {
  int batch_size = 8;  // per process
  int steps = 200;     // timed steps per repeat
  int repeats = 5;     // µs/step is reported as the median over repeats
  int warmup = 50;     // untimed steps first
};

struct OverheadBenchResult {
  std::vector<double> us_per_step;  // one per repeat; the slowest rank's, when distributed
  double us_median = 0;
  // One all-reduce (avg) of a buffer as large as the model's gradients, alone, median of many: the latency that
  // a DDP step cannot go below. 0 without a communicator.
  double allreduce_us = 0;
};

// The MLP's sizes, for the table's header and the PyTorch side's: in 32, hidden 32, out 10.
constexpr int kOverheadInputs = 32;
constexpr int kOverheadHidden = 32;
constexpr int kOverheadClasses = 10;

// With `communicator` (of any world size) the model is wrapped in DistributedDataParallel and the call is
// collective; with null it trains alone, unwrapped.
OverheadBenchResult run_overhead_bench(const OverheadBenchOptions& options, const comm::CommunicatorPtr& communicator);

}  // namespace tandem::bench
