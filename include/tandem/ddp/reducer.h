#pragma once
// The engine of DistributedDataParallel, independent of the wrapped module's type. See docs/reducer.md for
// the life cycle. In short:
//   construction  check the ranks' models match, broadcast parameters and buffers from rank 0, form buckets,
//                 hook every trainable parameter's AccumulateGrad node;
//   forward       prepare_for_forward(): broadcast buffers, decide whether this iteration synchronises;
//   backward      each hook copies its gradient into the bucket (or finds it already there, as a view); a
//                 complete bucket is handed to the comm hook at once, in bucket order, while backward goes on;
//                 the first hook queues an end-of-backward callback with the autograd engine;
//   end of backward  the callback resolves parameters that got no gradient, waits for every bucket and
//                 writes the averaged gradients back, so loss.backward() returns with synchronised .grad;
//   second forward   the buckets are rebuilt once, in the order backward produced the gradients (rank 0's);
//   uneven inputs    a rank out of data answers the others' collectives with zeros (shadow_iteration, used by
//                 ddp/join.h); gradients are averaged over the ranks that trained in that iteration.
//
// Only a backward through a forward of the wrapper reaches the reducer: prepare_for_forward() arms the hooks and
// the end of that synchronised backward disarms them, so a backward through the bare module (ddp.module(), a
// saliency map on one rank) stays local, communicates nothing and costs a flag test per parameter.
//
// Threading: hooks and the end-of-backward callback run on the autograd thread of the backward call; a mutex
// guards the state anyway. In a world of one the reducer registers no hooks and costs nothing.
#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/ddp/allreduce_spans.h"
#include "tandem/ddp/bucket.h"
#include "tandem/ddp/bucket_rebuild.h"
#include "tandem/ddp/bucket_tail.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/ddp/ddp_options.h"
#include "tandem/ddp/replica_sync.h"
#include "tandem/util/compat.h"

namespace tandem::ddp {

class Reducer {
 public:
  // Collective (every rank must construct its reducer at the same point). `communicator` may be null: a world
  // of one. The tensors are the module's own; they must stay on their device for the reducer's lifetime.
  Reducer(const torch::OrderedDict<std::string, torch::Tensor>& parameters,
          const torch::OrderedDict<std::string, torch::Tensor>& buffers, comm::CommunicatorPtr communicator,
          DdpOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call right before the module's forward. Collective when buffers are broadcast (grad mode on, synchronised
  // iteration, broadcast_buffers). Captures whether the coming backward synchronises (see set_require_sync) and
  // arms the gradient hooks for it; a forward with grad mode off changes nothing, since no backward can follow
  // it. Every
  // check_replicas_every synchronised forwards it compares the replicas (ReplicaDivergenceError if they
  // differ). Throws CommError once a
  // backward on this rank stopped half way or a gradient all-reduce failed: the ranks' collectives are then
  // out of step, and only a restart helps.
  void prepare_for_forward();

  // Call with the forward's output. A backward that reaches it ends with the reducer's all-reduces even when
  // it reaches no parameter on this rank, so the peers get an unused-parameter error instead of a timeout.
  void watch_output(const torch::Tensor& output);

  // False while a NoSyncGuard is alive: the backward of a forward run then only accumulates .grad locally, and
  // the next synchronised backward reduces the accumulated sum.
  void set_require_sync(bool require_sync) { require_sync_ = require_sync; }
  bool require_sync() const { return require_sync_; }

  // Records each bucket's all-reduce, from launch to completion, and the wait for them at the end of backward
  // into `timeline` (null: none), in its open step. Call between iterations; the timeline must outlive its use.
  void set_timeline(monitor::Timeline* timeline);

  // Replaces the comm hook; call between iterations, on every rank alike.
  void register_comm_hook(CommHookPtr hook);
  // The hook that reduces each bucket (DdpOptions::comm_hook, or the average), to read what it sent.
  const CommHook& comm_hook() const { return *options_.comm_hook; }

  // Collective, for a rank that has run out of data while others train on (see ddp/join.h): runs the
  // collectives of one synchronised iteration of the others (buffer broadcast, replica check, every bucket's
  // all-reduce) with zero gradients. Returns how many ranks trained in that iteration; 0 once every rank
  // shadows. When some rank trained, this rank's .grad then holds the gradient the trained ranks got, bit for
  // bit (their mean, written back as finish_backward writes it; parameters no rank used keep their .grad), so
  // that stepping this rank's optimizer keeps its state (momentum, Adam's moments) equal to theirs. Throws what
  // the trained ranks throw (an unused-parameter error, a failed collective).
  int shadow_iteration();
  // While on (a Join is open, see ddp/join.h), buffers are broadcast at each synchronised forward from the
  // highest rank that trained in the last synchronised iteration instead of from rank 0, which may have run out
  // of data: every step's BatchNorm statistics then come from a batch of that step. Every rank must switch it
  // alike, between iterations.
  void set_uneven_inputs(bool on) { uneven_inputs_ = on; }
  // Synchronised backwards this rank took part in with real gradients.
  int64_t synchronised_backwards() const { return synchronised_backwards_; }
  // Collective: every rank's parameters and buffers become `root`'s (after uneven inputs, the replicas of the
  // ranks that stopped early are behind).
  void copy_replica_from(int root);

  int world_size() const { return world_size_; }
  const comm::CommunicatorPtr& communicator() const { return communicator_; }
  // The current buckets: in reverse registration order at first, in the order of the first synchronised
  // backward's gradients (rank 0's) from the second synchronised forward on.
  const std::vector<BucketLayout>& bucket_layouts() const { return layouts_; }
  // Names of the trainable parameters, in registration order (BucketLayout::params index into this).
  std::vector<std::string> parameter_names() const;

 private:
  // A parameter that static_graph found unused in the first iteration has no bucket.
  static constexpr size_t kNoBucket = static_cast<size_t>(-1);
  struct Param {
    std::string name;
    torch::Tensor tensor;
    size_t bucket = kNoBucket;
    torch::Tensor bucket_view;  // this parameter's slice of its bucket, shaped like it
    compat::GradReadyHook hook;
  };
  struct Bucket {
    torch::Tensor buffer;  // payload (the gradients), then room for the tail in the last bucket
    // What the comm hook is handed: the payload (with the tail where it rides along) and each parameter's view.
    GradBucket for_hook;
    size_t pending = 0;    // parameters of this bucket not yet ready in this backward
    comm::WorkPtr work;
  };

  void allocate_buckets();
  void place_tail();
  void rebuild_buckets();
  void after_agreement(const TailAgreement& agreement);
  TailAgreement reduce_buckets();
  void synchronise_forward(bool participating);
  void expect_end_of_backward();
  void queue_finish_backward();  // with mutex_ held
  void mark_ready(size_t param_index);
  void copy_grad_into_bucket(Param& param);
  void launch_complete_buckets();
  void finish_backward();
  void average_over_trained(int trained_ranks);
  void write_back(const std::vector<char>& globally_used);
  void reset_iteration();
  void drain_in_flight() noexcept;

  comm::CommunicatorPtr communicator_;
  int rank_ = 0;
  int world_size_ = 1;
  DdpOptions options_;
  std::vector<Param> params_;
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<CoalescedBroadcaster> buffer_broadcaster_;
  // What check_replicas_every compares: every parameter, and the buffers when they are broadcast (otherwise
  // each rank's BatchNorm statistics are its own and differ by design).
  torch::OrderedDict<std::string, torch::Tensor> checked_state_;
  int64_t synchronised_forwards_ = 0;
  int64_t synchronised_backwards_ = 0;
  // Every parameter and buffer, for copy_replica_from.
  std::vector<torch::Tensor> model_state_;

  BucketRebuild rebuild_;
  bool shadowing_ = false;  // this iteration's collectives are a shadow_iteration's

  // The flags every rank reads at the end of a synchronised backward, sent with the last bucket.
  BucketTail tail_;
  // Whether backward reports which parameters it used: find_unused_parameters, until static_graph ends it.
  bool unused_search_ = false;

  // What the output hooks hold: they may outlive the reducer inside a graph the caller kept.
  std::shared_ptr<Reducer*> self_ = std::make_shared<Reducer*>(this);
  std::string broken_;  // why this reducer refuses further use; empty while it is usable
  AllReduceSpans spans_;

  // Buffers come from this rank at a synchronised forward while uneven_inputs_ is on: the highest rank that
  // trained in the last synchronised iteration in which any did.
  int last_trainer_ = 0;
  bool uneven_inputs_ = false;

  std::mutex mutex_;
  // Armed by a forward of the wrapper with grad mode on (and by a backward reaching its output), disarmed once
  // a synchronised backward finished: the gradient hooks ignore any other backward (one through the bare
  // module).
  bool backward_expected_ = false;
  bool require_sync_ = true;        // set by NoSyncGuard
  bool sync_this_iteration_ = true; // captured at forward
  bool callback_queued_ = false;
  bool local_unused_error_ = false;
  size_t next_bucket_to_launch_ = 0;
  std::vector<char> ready_;             // per parameter, in this synchronised backward
  std::vector<char> used_since_sync_;   // per parameter, in any backward since the last synchronisation
};

}  // namespace tandem::ddp
