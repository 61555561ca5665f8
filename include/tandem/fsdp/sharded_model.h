#pragma once
// The non-template core of FullyShardedDataParallel: a module's units (fsdp/flat_unit.h), when each is gathered,
// freed and reduced, and the hooks that tell it so. docs/fsdp.md walks through one step.
//
// Forward: before_forward() broadcasts the buffers and starts gathering the first unit; every operator that is
// about to read a parameter of a sharded unit waits for that unit's gather (fsdp/parameter_use_watch.h), and the
// first operator of another unit reshards the one before (reshard_after_forward) and starts gathering the unit
// that came next in the previous forward. after_forward() reshards all but the last unit. Backward: an operator
// of a gradient formula that reads a sharded parameter gathers its unit again (and starts on the unit before
// it); once every parameter of a unit has its gradient, the unit reshards and starts reduce-scattering the flat
// gradient, averaged, into its shard's grad; the end of backward waits for those reductions. With mixed precision
// (FsdpOptions::mixed_precision) the gathers and the module compute in the param dtype and the reductions run in
// the reduce dtype; the shards and their gradients stay float32.
//
// All of this runs on the thread that runs the forward and on the autograd engine's thread(s), one at a time.
#include <torch/nn/module.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/ddp/replica_sync.h"
#include "tandem/fsdp/flat_unit.h"
#include "tandem/fsdp/fsdp_options.h"
#include "tandem/fsdp/parameter_use_watch.h"
#include "tandem/util/compat.h"

namespace tandem::fsdp {

// Bytes one rank holds for training, counted as ZeRO's tests count them (optimizer state comes from
// optim::optimizer_state_bytes).
struct HeldBytes {
  int64_t shards = 0;          // the shards (the optimizer's parameters)
  int64_t shard_gradients = 0;
  int64_t unsharded = 0;       // gathered and in-flight parameter vectors
  int64_t full_gradients = 0;  // the module parameters' gradients before reduction, and reductions in flight
  int64_t total() const { return shards + shard_gradients + unsharded + full_gradients; }
};

class ShardedModel : public ParameterUser {
 public:
  // Collective: plans the units, broadcasts rank 0's parameters and buffers and shards the parameters. With a
  // reduce dtype other than float32 it first reduces a probe in that dtype, so that a backend without it is
  // refused here in one line rather than in the first backward. `communicator` may be null (a world of one) and
  // must outlive this object.
  ShardedModel(torch::nn::Module& module, comm::CommunicatorPtr communicator, FsdpOptions options);
  ~ShardedModel() override;
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  void before_forward();
  // A forward argument as the first unit should get it: a floating tensor in the param dtype under
  // mixed_precision.cast_forward_inputs, anything else unchanged.
  torch::Tensor cast_forward_input(const torch::Tensor& input) const;
  // Throws a failure met during the forward's gathers.
  void after_forward();
  // After a forward that threw: reshards and forgets the step, without throwing.
  void abandon_forward() noexcept;

  // The optimizer's parameters: one shard per unit.
  std::vector<torch::Tensor> shards() const;
  const std::vector<std::unique_ptr<FlatUnit>>& units() const { return units_; }
  comm::Communicator* communicator() const { return communicator_.get(); }
  const FsdpOptions& options() const { return options_; }

  // Off: backward leaves the gradients unsharded in the module's parameters, where the next backward adds to
  // them; the first backward with sync on reduce-scatters the sum (DDP's no_sync).
  void set_gradient_sync(bool on) { gradient_sync_ = on; }
  bool gradient_sync() const { return gradient_sync_; }

  // Per unit, the elements of this rank's shard, as (start, count), of the parameters that no rank gave a
  // gradient since the last synchronising backward, where the unit's other parameters got one: the optimizer would
  // move them on a zero gradient, and step_leaving_unused() (unused_parameters.h) keeps them.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>>& unused_elements() const { return unused_elements_; }

  // Collective: every parameter's full values by its name in the module's state dict.
  std::vector<std::pair<std::string, torch::Tensor>> gather_full_parameters();

  // Throws what was kept since the last call: a gather that failed, or an operator that read a parameter outside
  // the forward and backward (the placeholders are read and nothing is gathered: a gather on one rank alone would
  // wait for the others). The forward calls it, and so does the loop after each of its callbacks.
  void rethrow_failure();

  HeldBytes held_bytes() const;
  // The most bytes of gathered and in-flight vectors held at once since the last reset.
  int64_t peak_unsharded_bytes() const { return peak_unsharded_; }
  void reset_peak_unsharded_bytes() { peak_unsharded_ = 0; }

 private:
  enum class Phase { kIdle, kForward, kAfterForward };

  void before_use(const std::vector<int>& units) override;
  bool holds_placeholders(int unit) const override;
  // The forward moves from unit `from` to unit `to`: `from` is resharded, unless `to` runs nested in it (a float32
  // unit split out of it), and so is the unit `from` is nested in, unless the forward stays within that one.
  void leave_unit(int from, int to);
  void on_gradient_ready(int unit, size_t parameter);
  // Hooks every parameter's gradient accumulator, again where LibTorch replaced it: Tensor::set_data drops it
  // when a parameter's dtype changes, as under mixed precision a FullStateView's float32 values do.
  void hook_gradient_accumulators();
  void complete_unit(int unit);
  // Starts the reductions of completed units in reduction_order_, up to the first unit not completed yet: every
  // rank reduces the units in the same order, whichever of them got all their gradients on which rank. With
  // `one_in_flight`, the previous reduction is waited for and added into its shard first.
  void launch_ready_reductions(bool one_in_flight);
  // Collective (an all-reduce of one flag per parameter): which parameters got a gradient on some rank since the
  // last synchronising backward, in units_' order.
  std::vector<std::vector<char>> agree_on_use();
  // Where `used` marks some of a unit's parameters and not others, the others' elements in this rank's shard.
  void note_unused_elements(const std::vector<std::vector<char>>& used);
  void finish_backward();
  void reset_gradient_progress();
  void note_unsharded();
  void start_gather_of(int unit);
  // Starts gathering `unit` ahead of its gradient formulas, unless the last backward never read its parameters
  // (Linear saves its weight transposed and reads that instead) or it has completed.
  void prefetch_for_backward(int unit);
  // The unit that ran `offset` places after `unit` in the last complete forward, or -1.
  int neighbour_in_order(int unit, int offset) const;

  comm::CommunicatorPtr communicator_;
  FsdpOptions options_;
  std::vector<std::unique_ptr<FlatUnit>> units_;
  std::unique_ptr<ddp::CoalescedBroadcaster> buffers_;
  std::vector<compat::GradReadyHook> hooks_;  // per unit and parameter, in order
  // Per unit: the unit it runs nested in (a float32 unit split out of that one, MixedPrecision), or -1.
  std::vector<int> nested_in_;

  Phase phase_ = Phase::kIdle;
  bool gradient_sync_ = true;
  int current_ = -1;                  // the unit the forward is in
  std::vector<int> order_;            // units in the order this forward first used them
  std::vector<int> previous_order_;   // the same for the last forward that used every unit
  std::vector<char> seen_;
  std::vector<std::vector<char>> ready_;
  std::vector<std::vector<char>> used_since_sync_;  // per unit and parameter: got a gradient on this rank
  std::vector<std::vector<std::pair<int64_t, int64_t>>> unused_elements_;
  std::vector<int> reduction_order_;  // the units' reduce-scatters, the reverse of the forward's order
  size_t next_reduction_ = 0;         // in reduction_order_
  std::vector<size_t> ready_count_;
  std::vector<char> completed_;
  std::vector<char> gathered_in_backward_;  // units whose parameters this backward's formulas read
  std::vector<char> read_in_backward_;      // the same for the last complete backward
  bool backward_started_ = false;
  int reducing_ = -1;  // the unit whose gradient reduction was started last and not yet added into its shard
  std::exception_ptr failure_;
  int64_t peak_unsharded_ = 0;
};

// Keeps gradient synchronisation off while it lives (PyTorch's set_requires_gradient_sync(False)).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(ShardedModel& model) : model_(&model), previous_(model.gradient_sync()) {
    model.set_gradient_sync(false);
  }
  ~NoSyncGuard() {
    if (model_) model_->set_gradient_sync(previous_);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : model_(std::exchange(other.model_, nullptr)), previous_(other.previous_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  ShardedModel* model_;
  bool previous_;
};

}  // namespace tandem::fsdp
