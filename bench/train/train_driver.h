#pragma once
// `tandem bench train` as a whole. The driver starts, for each world size N and each round, N independent
// processes (no communication: the baseline), an N-rank DDP job (through `tandem run`, or mpirun for mpi) and,
// for N > 1, one DataParallel process with N replicas, each a worker of this same program writing its
// TrainBenchResult as JSON; with --compare pytorch it runs bench/train/pytorch_ddp_bench.py alike, in the same round.
// With bench.fsdp set (--strategy fsdp) each round at N > 1 runs an N-rank FSDP job beside the DDP job, in
// DataParallel's place, and --compare pytorch runs bench/train/pytorch_fsdp_bench.py (PyTorch's FSDP2).
// Then it prints one table row per framework, wrapper and N (medians over rounds, ratios paired within a
// round, so a machine that drifts between rounds moves both sides alike) and writes the same as JSON.
#include <string>
#include <vector>

#include "bench/train/train_bench.h"

namespace tandem::bench {

struct TrainDriverOptions {
  std::string device = "auto";  // cpu, cuda or auto; resolved once, so every worker and PyTorch run alike
  std::string backend;          // empty: comm::default_backend() (nccl on a GPU where built in, else gloo)
  std::vector<int> world_sizes{1, 2};
  TrainBenchOptions bench;
  int threads = 1;  // intra-op threads per process
  int rounds = 1;
  bool compare_pytorch = false;
  std::string pytorch_script = "bench/train/pytorch_ddp_bench.py";  // with bench.fsdp: bench/train/pytorch_fsdp_bench.py
  std::string json_path;  // empty: no JSON
  std::string program;    // this program: the workers (train_worker.h), and `run`, which starts the jobs
};

// Every setting is checked before the first worker starts: throws InvalidArgument for settings that could not
// run (a model that does not build at the image size, data larger than this host's memory, no mpirun for mpi, a
// --json file that cannot be written, fsdp without a world size above 1) or that the PyTorch side cannot match; CommError when a worker fails. The
// workers' result files live in a temporary folder that is removed however the driver ends.
void run_train_driver(TrainDriverOptions options);

}  // namespace tandem::bench
