#pragma once
// The loop's parallel strategies (train/parallel_strategy.h), one file each: ddp_strategy.cpp,
// data_parallel_strategy.cpp, fsdp_strategy.cpp. make_parallel_strategy() (strategies.cpp) chooses among them;
// a new strategy is a file of its own, its maker here, and its case there. Below, what they share.
#include <memory>
#include <string>
#include <utility>

#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/train/parallel_strategy.h"

namespace tandem::train {

std::unique_ptr<ParallelStrategy> make_ddp_strategy(optim::ZeroRedundancyOptimizer* sharded);
std::unique_ptr<ParallelStrategy> make_data_parallel_strategy(optim::ZeroRedundancyOptimizer* sharded);
std::unique_ptr<ParallelStrategy> make_fsdp_strategy();

// Throws "`uneven_inputs` cannot be combined with <conflict>": what needs the ranks in step.
[[noreturn]] void refuse_uneven_inputs(const std::string& conflict);
// A strategy whose ranks hold no shards to write refuses checkpoint::CheckpointFormat::kSharded.
void require_full_checkpoint_format(const LoopOptions& options);

// A strategy that holds the whole model on every rank (ddp, dp): rank 0 writes the module and the optimizer,
// whose shares a ZeroRedundancyOptimizer (`sharded`, else null) consolidates on rank 0 first (collective).
std::unique_ptr<CheckpointWriter> replica_checkpoint_writer(torch::nn::Module& module,
                                                            torch::optim::Optimizer& optimizer,
                                                            optim::ZeroRedundancyOptimizer* sharded);
// Every rank loads the whole state, of a full checkpoint or of a sharded one's pieces gathered whole.
std::unique_ptr<CheckpointReader> replica_checkpoint_reader(torch::nn::Module& module,
                                                            torch::optim::Optimizer& optimizer,
                                                            optim::ZeroRedundancyOptimizer* sharded);

// accumulate_locally()'s answer for a wrapper whose no_sync is a guard object.
template <typename Guard>
class GuardedAccumulation : public LocalAccumulation {
 public:
  explicit GuardedAccumulation(Guard guard) : guard_(std::move(guard)) {}

 private:
  Guard guard_;
};

}  // namespace tandem::train
