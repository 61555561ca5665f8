#include "bench/data/data_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/harness/child_processes.h"
#include "bench/harness/host.h"
#include "bench/harness/rounds.h"
#include "tandem/data/batch_loader.h"
#include "tandem/data/data_folder.h"
#include "tandem/data/mnist_dataset.h"
#include "tandem/util/error.h"

namespace tandem::bench {
namespace data_bench {
namespace {

struct Throughput {
  int64_t images = 0;
  double seconds = 0;
  double images_per_second() const { return seconds > 0 ? images / seconds : 0; }
};

// The folder as `tandem train --data DIR --val-split 0` reads it: every image is a training sample, with
// train's crop defaults for the image size and one decoding thread per intra-op thread.
std::shared_ptr<data::ImageFolderDataset> open_training_images(const DataBenchOptions& options) {
  if (data::has_mnist_files(options.data_dir)) {
    throw InvalidArgument(fmt::format("--data {} holds MNIST files; tandem bench data times image folders (one "
                                      "sub-folder of .jpg/.png images per class), e.g. from "
                                      "scripts/make-photo-folder DIR",
                                      options.data_dir));
  }
  torch::set_num_threads(options.threads);
  data::DataFolderOptions folder;
  folder.dir = options.data_dir;
  folder.image_size = options.image_size;
  folder.val_split = 0.0;
  folder.seed = options.seed;
  return data::open_data_folder(folder).image_train;
}

// Whole epochs of the training loader, as tandem train's loop draws them; the first `warmup_epochs` untimed.
Throughput time_tandem(const std::shared_ptr<data::ImageFolderDataset>& images, const DataBenchOptions& options,
                       int round) {
  const data::DistributedSamplerOptions sampling{1, 0, /*shuffle=*/true, options.seed, /*drop_last=*/false};
  data::BatchLoader loader(images, data::BatchSampler(data::DistributedSampler(images->size(), sampling),
                                                      options.batch_size, /*drop_last=*/false));
  Throughput timed;
  const int epochs = options.warmup_epochs + options.epochs;
  auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    if (epoch == options.warmup_epochs) start = std::chrono::steady_clock::now();
    // Every round draws other crops, as later epochs of a training run do.
    const int64_t epoch_number = int64_t{round} * epochs + epoch;
    images->set_epoch(epoch_number);
    loader.start_epoch(epoch_number);
    while (std::optional<data::Batch> batch = loader.next()) {
      if (epoch >= options.warmup_epochs) timed.images += batch->data.size(0);
    }
  }
  timed.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return timed;
}

Throughput time_torchvision(const std::string& python, const DataBenchOptions& options, int round) {
  const std::string command = fmt::format(
      "{} {} --data {} --image-size {} --batch-size {} --workers {} --epochs {} --warmup-epochs {} --seed {}",
      python, shell_quoted(options.torchvision_script), shell_quoted(options.data_dir), options.image_size,
      options.batch_size, options.threads, options.epochs, options.warmup_epochs, options.seed + round);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw Error("cannot start " + command);
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe.get())) output.append(buffer, n);
  const int status = pclose(pipe.release());
  const size_t last_line = output.find_last_of('\n', output.size() >= 2 ? output.size() - 2 : 0);
  const std::string result = output.substr(last_line == std::string::npos ? 0 : last_line + 1);
  const nlohmann::json json = nlohmann::json::parse(result, nullptr, /*allow_exceptions=*/false);
  if (status != 0 || !json.is_object() || !json.contains("images") || !json.contains("seconds")) {
    std::fputs(output.c_str(), stderr);
    throw CommError(fmt::format("the torchvision side failed (exit status {}; its output is above): {}", status,
                                command));
  }
  return {json["images"].get<int64_t>(), json["seconds"].get<double>()};
}

void check_options(const DataBenchOptions& options) {
  // A batch, the prefetched ones and the one being handed over, as float32.
  // In double: a --batch-size near int64's largest would overflow the product.
  const double batch_bytes = 12.0 * options.batch_size * options.image_size * options.image_size;
  if (batch_bytes > host_memory_bytes() / 4.0) {
    throw InvalidArgument(fmt::format("--batch-size {} at --image-size {} makes batches of {:.1f} GB, more than a "
                                      "quarter of this host's memory; lower --batch-size or --image-size",
                                      options.batch_size, options.image_size, batch_bytes / 1e9));
  }
  if (options.compare_torchvision && !std::filesystem::is_regular_file(options.torchvision_script)) {
    throw InvalidArgument(fmt::format("torchvision side script {} not found; run from the source tree or give "
                                      "--torchvision-script",
                                      options.torchvision_script));
  }
}

}  // namespace
}  // namespace data_bench

void run_data_bench(const DataBenchOptions& options) {
  using namespace data_bench;
  check_options(options);
  const std::shared_ptr<data::ImageFolderDataset> images = open_training_images(options);
  const std::string python = options.compare_torchvision ? find_python_with_torchvision() : "";
  fmt::print("tandem bench data: {} ({} images), {} px, batch {}, {} threads{}, {} timed epochs after {} warm-up "
             "a round, {} rounds\nhost {}, {}\n",
             options.data_dir, images->size(), options.image_size, options.batch_size, options.threads,
             options.compare_torchvision ? " (torchvision: as many DataLoader workers)" : "", options.epochs,
             options.warmup_epochs, options.rounds, host_name(), cpu_model());
  fmt::print("{:>6} {:>14} {:>19} {:>7}\n", "round", "tandem img/s", "torchvision img/s", "ratio");
  // Rows appear as their rounds end, in order with the torchvision side's own lines on stderr.
  std::fflush(stdout);
  std::vector<double> tandem_rates, torchvision_rates, ratios;
  for (int round = 0; round < options.rounds; ++round) {
    tandem_rates.push_back(time_tandem(images, options, round).images_per_second());
    if (!options.compare_torchvision) {
      fmt::print("{:>6} {:>14.0f}\n", round + 1, tandem_rates.back());
      std::fflush(stdout);
      continue;
    }
    torchvision_rates.push_back(time_torchvision(python, options, round).images_per_second());
    ratios.push_back(tandem_rates.back() / torchvision_rates.back());
    fmt::print("{:>6} {:>14.0f} {:>19.0f} {:>7.2f}\n", round + 1, tandem_rates.back(), torchvision_rates.back(),
               ratios.back());
    std::fflush(stdout);
  }
  if (options.compare_torchvision) {
    fmt::print("{:>6} {:>14.0f} {:>19.0f} {:>7.2f}   (ratio: median of the rounds' ratios)\n", "median",
               median_of(tandem_rates), median_of(torchvision_rates), median_of(ratios));
  } else {
    fmt::print("{:>6} {:>14.0f}\n", "median", median_of(tandem_rates));
  }
  std::fflush(stdout);
}

}  // namespace tandem::bench
