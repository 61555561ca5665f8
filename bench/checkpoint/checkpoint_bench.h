#pragma once
// `tandem bench checkpoint`: how fast tandem writes and reads a PyTorch distributed checkpoint (DCP) of a large
// model, beside PyTorch's own dcp.save and dcp.load (bench/checkpoint/pytorch_dcp_bench.py) in the same rounds.
//
// The model is the wide MLP of `tandem bench memory` (bench/memory/memory_bench.h: layers of width x width and
// their biases), its tensors random float32 on the CPU, written by one process as one `.distcp` file and its
// `.metadata`, then read back whole. tandem writes with checkpoint::DistributedCheckpointWriter and reads with
// checkpoint::read_distributed_checkpoint (every piece checked against its CRC-32, each tensor allocated); PyTorch
// saves with dcp.save and loads with dcp.load into tensors it allocated before the clock starts. Both sides sync
// their files as they write them. Each round times tandem, then PyTorch, on a folder of its own under `dir`
// that is removed after; the ratios are taken within a round and their median printed.
#include <cstdint>
#include <string>

namespace tandem::bench {

struct CheckpointBenchOptions {
  int64_t mlp_parameters = 250'000'000;  // 1 GB of float32
  int64_t mlp_width = 8192;
  int rounds = 3;
  std::string dir;  // where the checkpoints go; empty: $TMPDIR or /tmp
  bool compare_pytorch = false;
  std::string pytorch_script = "bench/checkpoint/pytorch_dcp_bench.py";
};

// Prints one row per round and the medians. Throws InvalidArgument before any timing for a model that does not fit
// in a quarter of this host's memory twice (written and read back), a missing `dir`, or, with compare_pytorch, a
// missing script; CommError when the PyTorch side fails.
void run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace tandem::bench
