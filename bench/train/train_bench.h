#pragma once
// The training-step measurement behind `tandem bench train`: the seeds' CNN, SGD with momentum, a fixed batch
// per process, timed in repeats after a warm-up. One process runs it as one rank of a DDP or an FSDP job, alone
// with no communication at all (the baseline that scaling efficiency is measured against), or as DataParallel
// over N replicas, with the batch of the N ranks of the DDP job it is compared with.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/comm/communicator.h"
#include "tandem/ddp/ddp_options.h"
#include "tandem/ddp/powersgd_hook.h"
#include "tandem/fsdp/fsdp_options.h"

namespace tandem::bench {

struct TrainBenchOptions {
  std::string model = "cnn";  // any name in the model registry (--model of tandem train)
  int64_t image_size = 28;    // square inputs; the CNN takes 28
  int batch_size = 64;  // per process
  int steps = 20;       // timed steps per repeat
  int repeats = 5;      // ms/step is reported as median and spread over repeats
  int warmup = 10;      // untimed steps first
  double lr = 0.01;     // times the world size, as the seeds do
  uint64_t seed = 0;
  torch::Device device = torch::kCPU;  // model and data live here; a GPU is synchronised before each reading
  ddp::DdpOptions ddp;  // bucket sizes and gradient_as_bucket_view, as the command line sets them
  // How DDP reduces each bucket: average, fp16, bf16 or powersgd (with `powersgd`); each process makes its own.
  std::string comm_hook = "average";
  ddp::PowerSgdOptions powersgd;
  // Set: a distributed run wraps the model in fsdp::FullyShardedDataParallel with these options (each direct
  // child a unit, as PyTorch's fully_shard per child) instead of DDP; the optimizer steps on the shards.
  std::optional<fsdp::FsdpOptions> fsdp;
  // Non-empty: one process trains with dp::DataParallel, a replica on each of these devices (the first must be
  // `device`), batch_size samples each; with no communicator only.
  std::vector<torch::Device> data_parallel_devices;
};

struct TrainBenchResult {
  std::vector<double> ms_per_step;  // one per repeat; the slowest rank's, when distributed
  double ms_median = 0;
  double ms_min = 0;
  double ms_max = 0;
  // One all-reduce (avg) of a buffer as large as all gradients together, alone: what DDP would add to a step
  // if none of it were hidden behind backward. 0 without communication.
  double allreduce_ms = 0;
  // Of the gradient all-reduce time, the share that ran while backward still computed, measured with a
  // timeline (monitor/timeline_trace.h) over one more untimed repeat, averaged over the ranks; -1 without DDP.
  double hidden_share = -1;
  int64_t parameters = 0;
  // What the comm hook handed to all-reduces per timed step, on this rank (the last bucket's few bookkeeping
  // elements included); 0 without DDP.
  double bytes_per_step = 0;
};

// With `communicator` (world size > 1) the model is wrapped in DistributedDataParallel (or, with options.fsdp,
// FullyShardedDataParallel) and the call is collective; with null it trains alone, or in DataParallel (options.data_parallel_devices). The data are random images shaped like Fashion-MNIST made before
// timing, so the figure measures training steps, not loading.
TrainBenchResult run_train_bench(const TrainBenchOptions& options, const comm::CommunicatorPtr& communicator);

// Builds the model as run_train_bench does, so that one that cannot take these images fails before any worker
// starts. Throws InvalidArgument naming --model and --image-size.
void check_model_builds(const TrainBenchOptions& options);

// The random data that run_train_bench makes before timing, in bytes: images and labels of a few batches, for
// every replica.
double train_data_bytes(const TrainBenchOptions& options);

}  // namespace tandem::bench
