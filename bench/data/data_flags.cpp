// `tandem bench data`: images per second of tandem train's image-folder input pipeline alone, beside
// torchvision's ImageFolder + DataLoader (bench/data/data_bench.h).
//   scripts/make-photo-folder /tmp/photos
//   tandem bench data --data /tmp/photos --threads 2 --compare torchvision --rounds 3
#include <algorithm>
#include <memory>
#include <thread>

#include "bench/bench_commands.h"
#include "apps/flag_checks.h"
#include "bench/data/data_bench.h"
#include "tandem/util/error.h"
#include "tandem/util/needs.h"

namespace tandem::app {
namespace {

struct BenchDataFlags {
  bench::DataBenchOptions bench;
  std::string compare;
  const CLI::Option* torchvision_script = nullptr;
};

const CommandRegistration kBenchData{
    bench_commands(),
    "data",
    "Images per second of the image-folder training pipeline (decode, random resized crop, flip, normalise, "
    "batch); vs torchvision",
    [](CLI::App& command) -> std::function<int()> {
      // Decoding threads beyond the cores only take turns on them.
      const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
      auto flags = std::make_shared<BenchDataFlags>();
      bench::DataBenchOptions& o = flags->bench;
      command.add_option("--data", o.data_dir,
                         "Image folder to read (one sub-folder of .jpg/.png images per class; "
                         "scripts/make-photo-folder writes one)")
          ->required()
          ->check(CLI::ExistingDirectory);
      command.add_option("--image-size", o.image_size, "Square training crop in pixels (tandem train --image-size)")
          ->capture_default_str()
          ->check(between<int64_t>(1, kLargestImageSize));
      command.add_option("--batch-size", o.batch_size, "Images per batch")
          ->capture_default_str()
          ->check(at_least<int64_t>(1));
      command.add_option("--threads", o.threads,
                         "Decoding threads, as tandem train --threads gives them; torchvision gets as many "
                         "DataLoader workers")
          ->capture_default_str()
          ->check(between<int>(1, cores));
      command.add_option("--epochs", o.epochs, "Timed epochs per round and side")
          ->capture_default_str()
          ->check(at_least<int>(1));
      command.add_option("--warmup-epochs", o.warmup_epochs, "Untimed epochs before them (page cache, workers)")
          ->capture_default_str()
          ->check(at_least<int>(0));
      command.add_option("--rounds", o.rounds,
                         "Rounds, each timing tandem then torchvision; the ratio is the median of the rounds' "
                         "ratios")
          ->capture_default_str()
          ->check(at_least<int>(1));
      command.add_option("--compare", flags->compare,
                         "Also time torchvision's ImageFolder + DataLoader with the same transforms: torchvision")
          ->check(CLI::IsMember({"torchvision"}));
      flags->torchvision_script =
          command.add_option("--torchvision-script", o.torchvision_script, "--compare torchvision: the side script")
              ->capture_default_str();
      command.add_option("--seed", o.seed, "Seed of the shuffle and the augmentation")
          ->capture_default_str()
          ->check(at_least<uint64_t>(0));
      return [flags]() -> int {
        if (flags->torchvision_script->count() > 0 && flags->compare.empty()) {
          throw InvalidArgument(only_read_with("--torchvision-script", "--compare torchvision"));
        }
        flags->bench.compare_torchvision = flags->compare == "torchvision";
        bench::run_data_bench(flags->bench);
        return 0;
      };
    }};

}  // namespace
}  // namespace tandem::app
