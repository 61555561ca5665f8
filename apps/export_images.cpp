// `tandem export-images`: writes Fashion-MNIST (or MNIST) out as a folder of PNG files per class, real data in
// the flower_photos layout for `tandem train --data DIR`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "apps/command.h"
#include "apps/flag_checks.h"
#include "tandem/data/export_image_folder.h"
#include "tandem/data/mnist_dataset.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem::app {
namespace {

struct ExportFlags {
  std::string source = "/usr/share/datasets/fashion-mnist";
  std::string out;
  data::ExportImageFolderOptions options;  // --per-class; the class names and the prefix are set as it runs
  std::vector<std::string> sets = {"train", "t10k"};
  bool numeric_names = false;
};

struct IdxSetFiles {
  std::string images;
  std::string labels;
};

// The sets whose images `source` holds: "train" for train-images-idx3-ubyte[.gz], sorted.
std::vector<std::string> sets_in(const std::string& source) {
  static const std::string kImages = "-images-idx3-ubyte";
  std::vector<std::string> sets;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(source, error)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".gz") == 0) name.resize(name.size() - 3);
    if (name.size() > kImages.size() && name.compare(name.size() - kImages.size(), kImages.size(), kImages) == 0) {
      sets.push_back(name.substr(0, name.size() - kImages.size()));
    }
  }
  std::sort(sets.begin(), sets.end());
  sets.erase(std::unique(sets.begin(), sets.end()), sets.end());
  return sets;
}

// Where Debian's package puts the data a folder without IDX files lacks.
constexpr const char* kInstallTheDataSet =
    "install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist), or give --source the "
    "folder that holds the IDX files";

// SOURCE/SET-CONTENT-KIND-ubyte[.gz] ("images", "idx3"), as data::MnistDataset finds it.
std::string idx_file(const std::string& source, const std::string& set, const std::string& content,
                     const std::string& kind) {
  const std::string path = data::find_idx_file(source, set + "-" + content, kind);
  if (!path.empty()) return path;
  // A set name that the folder does not hold is a typo in --sets; a folder without IDX files, or a set with a
  // file missing, needs the data installed.
  const std::vector<std::string> present = sets_in(source);
  const std::string remedy =
      present.empty() || std::find(present.begin(), present.end(), set) != present.end()
          ? std::string(kInstallTheDataSet)
          : fmt::format("the sets it holds are {}: name those with --sets", fmt::join(present, ", "));
  throw InvalidArgument(
      fmt::format("--source {} holds no {}-{}-{}-ubyte[.gz]; {}", source, set, content, kind, remedy));
}

// Every file of every set, found before the first image is written: a missing one leaves no half-written folder.
std::vector<IdxSetFiles> find_sets(const ExportFlags& flags) {
  if (!std::filesystem::is_directory(flags.source)) {
    throw InvalidArgument(fmt::format("--source {} is not a folder; {}", flags.source, kInstallTheDataSet));
  }
  std::vector<IdxSetFiles> sets;
  for (const std::string& set : flags.sets) {
    sets.push_back({idx_file(flags.source, set, "images", "idx3"), idx_file(flags.source, set, "labels", "idx1")});
  }
  return sets;
}

CommandRegistration registration{
    "export-images",
    "Write Fashion-MNIST (IDX files) out as an image folder: OUT/CLASS/*.png, one sub-folder per class",
    [](CLI::App& command) -> std::function<int()> {
      auto flags = std::make_shared<ExportFlags>();
      command.add_option("out", flags->out, "Folder to write (created if missing)")->required();
      command.add_option("--source", flags->source, "Folder with SET-images-idx3-ubyte[.gz] and SET-labels-idx1-ubyte[.gz]")
          ->capture_default_str();
      command.add_option("--per-class", flags->options.per_class, "Images per class at most (default: all)")
          ->check(at_least<int64_t>(1));
      command.add_option("--sets", flags->sets, "IDX file sets to export, in order")->capture_default_str();
      command.add_flag("--numeric-names", flags->numeric_names,
                       "Name class folders 0..9 instead of Fashion-MNIST's class names (e.g. for MNIST)");
      return [flags] {
        if (std::filesystem::exists(flags->out) && !std::filesystem::is_directory(flags->out)) {
          throw InvalidArgument(fmt::format("{} is a file, not a folder: give export-images a folder to write (it "
                                            "is created if missing)",
                                            flags->out));
        }
        data::ExportImageFolderOptions& options = flags->options;
        if (!flags->numeric_names) options.class_names = data::fashion_mnist_folder_names();
        std::vector<int64_t> written;
        const std::vector<IdxSetFiles> files = find_sets(*flags);
        for (size_t i = 0; i < files.size(); ++i) {
          options.prefix = flags->sets[i];
          data::export_idx_as_image_folder(files[i].images, files[i].labels, flags->out, options, written);
        }
        const int64_t total = std::accumulate(written.begin(), written.end(), int64_t{0});
        log::info("wrote {} PNG images in {} class folders to {}", total, written.size(), flags->out);
        return 0;
      };
    }};

}  // namespace
}  // namespace tandem::app
