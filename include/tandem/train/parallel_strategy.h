#pragma once
// How a train::Loop spreads a model's work: the one seam between the loop and DDP, DataParallel, FSDP (or a
// strategy of the user's own). The loop talks to the model only through it. The life cycle, one Loop::fit:
//
//   validate(options, world)     before anything is built: the options this strategy cannot train with, refused
//                                naming the fields (train::validate() asks the strategy LoopOptions::strategy makes)
//   wrap(model)                  once, after the run dir is chosen and before a checkpoint is restored: the model
//                                (already on LoopOptions::device) and its optimizer go into the wrapper
//   restore_from(path)           collective, only when the run continues a checkpoint; its reader loads it on
//                                every rank
//   per step: forward() for each batch, all but the step's last under accumulate_locally(); backward by the loop;
//             step(), around the optimizer's step
//   after_user_code()            after each callback that may have read the model's tensors
//   before_evaluation(), evaluation_forward()  at each epoch's end
//   prepare_checkpoint(path)     collective, at each checkpoint; rank 0 writes with its writer
//   unwrap()                     collective, at the run's end: the model and optimizer as the caller gave them,
//                                with the trained values
//
// Every rank runs the same strategy, and calls each collective member in the same order.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/ddp/join.h"
#include "tandem/ddp/reducer.h"
#include "tandem/nn/model_holder.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/train/loop_options.h"

namespace tandem::train {

// What wrap() is given, for the run's duration: the caller's model on the run's device, its optimizer, and the
// run's group (null: a world of one).
struct ModelToWrap {
  const LoopOptions& options;
  nn::ModelHolder model;
  torch::optim::Optimizer& optimizer;
  comm::CommunicatorPtr communicator;
};

// Rank 0's part of a checkpoint: writes the model's and the optimizer's state to `path` with the loop's `state`.
// It holds whatever the strategy gathered for it (FSDP's full state) until it goes.
class CheckpointWriter {
 public:
  virtual ~CheckpointWriter() = default;
  virtual void write(const std::string& path, const checkpoint::CheckpointState& state, const checkpoint::ExtraState& extra) = 0;
};

// Every rank's part of continuing a checkpoint: loads the model's and the optimizer's state from it and returns
// the loop's state, with the callbacks' in `extra`.
class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;
  virtual checkpoint::CheckpointState read(const std::string& path, checkpoint::ExtraState* extra) = 0;
};

// While it lives, backward accumulates gradients on each rank without reducing them (DDP's no_sync).
class LocalAccumulation {
 public:
  virtual ~LocalAccumulation() = default;
};

class ParallelStrategy {
 public:
  virtual ~ParallelStrategy() = default;

  // Throws InvalidArgument naming the fields (in backticks) of `options` this strategy cannot train with in a
  // world of `world_size` ranks.
  virtual void validate(const LoopOptions& options, int world_size) const = 0;
  virtual void wrap(const ModelToWrap& model) = 0;

  // The training forward of one batch.
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
  // Null where each batch's backward is local anyway.
  virtual std::unique_ptr<LocalAccumulation> accumulate_locally() { return nullptr; }
  // Runs `optimizer_step` (the loop's scaler and optimizer) and returns what it returned.
  virtual bool step(const std::function<bool()>& optimizer_step) { return optimizer_step(); }
  // Under LoopOptions::uneven_inputs, opened before an epoch's first forward (ddp/join.h); null where the
  // strategy has no uneven ranks (validate() refuses uneven_inputs there).
  virtual std::unique_ptr<ddp::Join> join_uneven_inputs() { return nullptr; }
  // Throws at once what a callback did to the model that the strategy cannot take (fsdp's placeholder reads).
  virtual void after_user_code() {}
  // The reducer whose all-reduces the run's timeline records; null: none.
  virtual ddp::Reducer* reducer() { return nullptr; }

  // Collective, before the epoch's evaluation: every rank holds the model that the checkpoint saves.
  virtual void before_evaluation() {}
  // The evaluation forward: the bare model by default, its weights the same on every rank.
  virtual torch::Tensor evaluation_forward(const torch::Tensor& input) = 0;

  // The devices whose random generators a checkpoint holds.
  virtual std::vector<torch::Device> devices() const = 0;
  // Collective: what every rank sends or writes before rank 0 writes `path` with the returned writer.
  virtual std::unique_ptr<CheckpointWriter> prepare_checkpoint(const std::string& path) = 0;
  // Collective: what every rank gathers before each reads `path` with the returned reader.
  virtual std::unique_ptr<CheckpointReader> restore_from(const std::string& path) = 0;

  // Collective, at the run's end.
  virtual void unwrap() {}
};

// The strategy LoopOptions::strategy names. `sharded`: the optimizer when it is a ZeroRedundancyOptimizer
// (Loop::fit's overload for it), else null; the strategies that hold the whole model on each rank consolidate its
// state before each checkpoint.
std::unique_ptr<ParallelStrategy> make_parallel_strategy(const LoopOptions& options,
                                                         optim::ZeroRedundancyOptimizer* sharded = nullptr);

}  // namespace tandem::train
