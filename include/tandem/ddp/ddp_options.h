#pragma once
// The knobs of DistributedDataParallel, with PyTorch's defaults. Every rank must pass the same values (the
// construction check compares them, like the model itself).
#include <memory>

namespace tandem::ddp {

class CommHook;

// How the gradients are cut into buckets.
enum class BucketPlan {
  // The caps below, as PyTorch does.
  kCaps,
  // The caps, unless the collectives run on the host (gloo, mpi) and this host's ranks' compute threads already
  // take every core: a bucket reduced during backward then competes with backward for a core and slows it more
  // than it hides (docs/reducer.md), so every gradient goes in one bucket per dtype, reduced at the end of
  // backward. Rank 0 decides for all. tandem train and tandem bench train use it.
  kAdaptToHost,
};

struct DdpOptions {
  // Gradients travel in buckets of about this many MiB; a bucket's all-reduce starts as soon as backward has
  // produced all of its gradients, so smaller buckets start communicating earlier.
  double bucket_cap_mb = 25.0;
  // The first bucket (the last layers' gradients, which backward produces first) is kept small so that
  // communication starts early, as in PyTorch.
  double first_bucket_cap_mb = 1.0;
  BucketPlan bucket_plan = BucketPlan::kCaps;
  // Buffers (e.g. BatchNorm running statistics) follow rank 0 at each synchronised forward (under Join, the
  // highest rank that trained in the previous synchronised iteration; see ddp/join.h).
  bool broadcast_buffers = true;
  // The graph is the same in every iteration: the same parameters get gradients, in the same order. After the
  // first iteration the parameters no rank used leave the buckets for good, and backward stops reporting which
  // parameters it used (the unused-parameter search of find_unused_parameters). A parameter that gets a
  // gradient later anyway is an error. As in PyTorch.
  bool static_graph = false;
  // Parameters that got no gradient in an iteration are treated as ready (their local gradient, or zero) so
  // the reduction completes; parameters that no rank used keep their .grad untouched. Without it such a
  // parameter is an error on every rank.
  bool find_unused_parameters = false;
  // Make each parameter's .grad a view into its bucket, saving one copy per parameter after the all-reduce.
  // .grad then aliases the bucket: do not keep references to it across iterations.
  bool gradient_as_bucket_view = false;
  // How each bucket is reduced; null means plain averaging (make_average_hook()).
  std::shared_ptr<CommHook> comm_hook;
  // Every this many synchronised forwards, the ranks compare a fingerprint of their parameters' bytes (and of
  // the buffers, when broadcast_buffers makes them equal) and every rank stops with an error naming the ranks
  // whose replicas differ. Replicas that drift apart (a skipped all-reduce, a rank that changed its weights
  // alone) otherwise train on silently. 0: never. Costs one copy to the host and one hash of the model, plus one
  // small all-gather, per check.
  int64_t check_replicas_every = 0;
};

}  // namespace tandem::ddp
