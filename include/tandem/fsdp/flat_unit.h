#pragma once
// One FSDP unit: its parameters flattened into one float32 vector, padded to a multiple of the world size,
// of which this rank keeps one equal shard. The shard is what the optimizer steps on; the module's own
// parameter tensors point into the gathered vector while the unit is unsharded and at a one-element
// placeholder, broadcast to their shapes, while it is sharded. Both are of the unit's param dtype (mixed
// precision: the shard is cast before it is gathered), so a parameter never changes dtype once the unit is made:
// LibTorch's Tensor::set_data drops a parameter's gradient accumulator, and with it ShardedModel's hook, when the
// dtype changes. Gradients arrive in the param dtype and are reduced in the unit's reduce dtype.
//
// Collectives: the constructor's broadcast of rank 0's values, start_gather()'s all-gather and
// start_gradient_reduction()'s reduce-scatter. Every rank must call them in the same order; the caller
// (ShardedModel) does, since the model runs the same operators on every rank. Every method that touches the
// module's parameters pauses the parameter-use watch for its own operators.
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/fsdp/unit_plan.h"

namespace tandem::fsdp {

class FlatUnit {
 public:
  struct Parameter {
    std::string name;
    torch::Tensor tensor;  // the module's own parameter
    std::vector<int64_t> shape;
    int64_t offset = 0;  // in the flat vector
    int64_t numel = 0;
  };

  // Collective: broadcasts rank 0's values of the unit's parameters (every rank starts alike), keeps this
  // rank's shard and reshards. `communicator` may be null: a world of one. The parameters must be float32;
  // param_dtype and reduce_dtype are float32, bfloat16 or float16.
  FlatUnit(UnitSpec spec, comm::Communicator* communicator, torch::ScalarType param_dtype,
           torch::ScalarType reduce_dtype);

  const std::string& name() const { return name_; }
  const std::vector<Parameter>& parameters() const { return parameters_; }
  // The optimizer's parameter: a leaf of padded_numel() / world size elements.
  torch::Tensor& shard() { return shard_; }
  const torch::Tensor& shard() const { return shard_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  bool is_unsharded() const { return unsharded_; }
  torch::ScalarType param_dtype() const { return param_dtype_; }
  torch::ScalarType reduce_dtype() const { return reduce_dtype_; }
  // Bytes of the gathered vector (held while unsharded or while a gather is in flight): the unit's cost.
  int64_t unsharded_bytes() const;
  // What this unit holds now: gathered or in-flight vectors; the module parameters' full gradients, those
  // accumulated under no_sync and the reductions in flight.
  int64_t held_parameter_bytes() const;
  int64_t held_gradient_bytes() const;

  // All-gathers this unit started since it was made: what a forward's gathers are counted by.
  int64_t gathers_started() const { return gathers_started_; }

  // Starts the all-gather of every rank's shard into a new vector; does nothing while one is held or in
  // flight. A new vector each time: autograd may still hold views of the previous one (Linear saves its
  // weight transposed), whose values must not change under it.
  void start_gather();
  // Waits for the gather (starting it if needed) and points the module's parameters into the vector.
  void unshard();
  // Points the parameters back at the placeholder and lets the vector go (after its gather completed).
  void reshard();

  // no_sync: adds the parameters' gradients into a flat full-size vector of the reduce dtype and drops them (a
  // micro-batch's gradients add up there, not in the param dtype).
  void accumulate_gradients();
  // Adds the parameters' gradients (a missing one counts as zeros) to what accumulate_gradients() kept, in a flat
  // vector of the reduce dtype, drops them and starts the averaging reduce-scatter of that vector into this
  // rank's piece.
  void start_gradient_reduction();
  // Waits for that reduce-scatter and adds the piece, as float32, into shard().grad(), or drops it where
  // `into_shard` is false (no rank used a parameter of the unit: its shard's gradient stays as it was); does
  // nothing if none was started.
  void finish_gradient_reduction(bool into_shard = true);

  // Collective: a copy of every parameter's full values, by name, gathered without touching the unit's state.
  std::vector<std::pair<std::string, torch::Tensor>> gather_copies();

 private:
  torch::Tensor gather_now();
  // Adds every parameter's gradient into `flat` (reduce dtype, padded) at its offset and drops it.
  void move_gradients_into(torch::Tensor& flat);

  std::string name_;
  comm::Communicator* communicator_;
  int rank_ = 0;
  int world_size_ = 1;
  std::vector<Parameter> parameters_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  torch::ScalarType param_dtype_;
  torch::ScalarType reduce_dtype_;
  torch::Tensor shard_;
  torch::Tensor placeholder_;  // one zero, which resharded parameters are broadcast from
  bool unsharded_ = false;
  torch::Tensor gathered_;     // while unsharded
  torch::Tensor in_flight_;    // the gather's output until it completed
  comm::WorkPtr gather_work_;
  int64_t gathers_started_ = 0;
  torch::Tensor accumulated_;  // no_sync's gradients, flat, in the reduce dtype
  torch::Tensor reduction_input_, reduction_output_;
  comm::WorkPtr reduction_work_;
};

}  // namespace tandem::fsdp
