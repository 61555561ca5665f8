#pragma once
// PowerSGD (Vogels et al., 2019), PyTorch's low-rank gradient compression hook, with its options and its numerics:
// on the same buckets and seed it gives what torch.distributed's powerSGD_hook gives (tests/fixtures holds the
// proof). Per bucket and iteration, once compression has started:
//   1. with error feedback, add what compression lost in this bucket last time to the local gradients;
//   2. view each gradient as a matrix M (n = first dimension, m = the rest); those for which rank r saves
//      enough, (n + m) * r * min_compression_rate < n * m, are compressed, the others are averaged plainly,
//      batched into one all-reduce;
//   3. P = M Q for each compressed M, with Q from the last iteration (warm start) or drawn anew; all-reduce the
//      Ps, orthogonalize them, Q = M^T P, all-reduce and average the Qs; the bucket gets P Q^T.
// Bytes on the wire per compressed matrix: (n + m) * r elements instead of n * m.
//
// launch() issues the plain and the P all-reduce; the Q all-reduce and the decompression run in the Work's
// wait(), which the reducer calls at the end of backward, in bucket order, so every rank issues the same
// collectives in the same order.
//
// A hook object keeps state per bucket of one model (errors, Ps, Qs, the iteration count): give every
// DistributedDataParallel its own, on every rank. It follows that model's one bucket rebuild (GradBucket::model
// tells it apart from another model's buckets, which it refuses).
#include <cstdint>

#include "tandem/ddp/comm_hook.h"

namespace tandem::ddp {

// PyTorch's PowerSGDState, same names and defaults.
struct PowerSgdOptions {
  // r: the rank of each gradient's approximation. Lower compresses more and approximates worse; PyTorch
  // suggests 1, then doubling until accuracy is good enough.
  int64_t matrix_approximation_rank = 1;
  // Iterations of plain averaging before compression starts: early training is sensitive to inaccurate
  // gradients. At least 2 with error feedback or warm start (their state must be made after DDP's buckets are
  // final).
  int64_t start_powersgd_iter = 1000;
  // A matrix is compressed only when its compressed size times this is below its size; 1-D gradients (n x 1)
  // never are unless this is below 1.
  double min_compression_rate = 2.0;
  // Carry each rank's compression error into its next gradient of the same bucket.
  bool use_error_feedback = true;
  // Start each iteration's power iteration from the last iteration's Q instead of a random one.
  bool warm_start = true;
  // Added to each column norm in the Gram-Schmidt orthogonalization (rank <= 2 or 16-bit gradients), so that a
  // zero column gives zeros instead of NaN.
  double orthogonalization_epsilon = 0.0;
  // Seeds the draws of the random initial Qs; the same on every rank, so the ranks draw the same Qs.
  uint32_t random_seed = 0;
};

// Throws InvalidArgument for options PyTorch refuses (rank < 1, start_powersgd_iter < 2 with error feedback or
// warm start, a negative rate or epsilon).
CommHookPtr make_powersgd_hook(PowerSgdOptions options = {});

}  // namespace tandem::ddp
