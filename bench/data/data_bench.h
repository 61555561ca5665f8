#pragma once
// `tandem bench data`: images per second of the training input pipeline alone, over whole epochs of an image
// folder, and beside it torchvision's (bench/data/torchvision_data_bench.py) in the same rounds.
//
// The tandem side is the pipeline `tandem train` runs on an image folder, through the same code: the folder is
// opened by data::open_data_folder (every image a training sample), and a BatchLoader over a shuffling
// DistributedSampler of world size 1 hands out its batches: decode, RandomResizedCrop, horizontal flip,
// normalisation and batching on `threads` threads, as train does with --threads. The torchvision side is
// ImageFolder + DataLoader with `threads` worker processes and the same transforms (RandomResizedCrop,
// RandomHorizontalFlip, ToTensor, Normalize). Each round times tandem, then torchvision, each after its own
// warm-up epochs; the ratio is taken within a round and its median printed, so a machine that drifts between
// rounds moves both sides alike.
#include <cstdint>
#include <string>

namespace tandem::bench {

struct DataBenchOptions {
  std::string data_dir;
  int64_t image_size = 224;
  int64_t batch_size = 64;
  int threads = 2;         // tandem's decoding threads; torchvision's DataLoader workers
  int epochs = 3;          // timed, per round and side
  int warmup_epochs = 1;   // untimed, before the timed ones (files into the page cache, workers started)
  int rounds = 1;
  bool compare_torchvision = false;
  std::string torchvision_script = "bench/data/torchvision_data_bench.py";
  uint64_t seed = 0;
};

// Throws InvalidArgument, before any timing, for a folder that is not an image folder (MNIST files included),
// a batch that could not fit in memory, or, with compare_torchvision, a missing script or a Python without
// torchvision; CommError when the torchvision side fails. Prints one row per round and the medians.
void run_data_bench(const DataBenchOptions& options);

}  // namespace tandem::bench
