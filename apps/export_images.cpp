// `tandem export-images`: writes Fashion-MNIST (or MNIST) out as a folder of PNG files per class, real data in
// the flower_photos layout for `tandem train --data DIR`.
#include <fstream>
#include <numeric>

#include "apps/command.h"
#include "tandem/data/export_image_folder.h"
#include "tandem/util/log.h"

namespace tandem::app {
namespace {

struct ExportFlags {
  std::string source = "/usr/share/datasets/fashion-mnist";
  std::string out;
  int64_t per_class = -1;
  std::vector<std::string> sets = {"train", "t10k"};
  bool numeric_names = false;
};

CommandRegistration registration{
    "export-images",
    "Write Fashion-MNIST (IDX files) out as an image folder: OUT/CLASS/*.png, one sub-folder per class",
    [](CLI::App& command) -> std::function<int()> {
      auto flags = std::make_shared<ExportFlags>();
      command.add_option("out", flags->out, "Folder to write (created if missing)")->required();
      command.add_option("--source", flags->source, "Folder with SET-images-idx3-ubyte[.gz] and SET-labels-idx1-ubyte[.gz]")
          ->capture_default_str();
      command.add_option("--per-class", flags->per_class, "Images per class at most (default: all)");
      command.add_option("--sets", flags->sets, "IDX file sets to export, in order")->capture_default_str();
      command.add_flag("--numeric-names", flags->numeric_names,
                       "Name class folders 0..9 instead of Fashion-MNIST's class names (e.g. for MNIST)");
      return [flags] {
        data::ExportImageFolderOptions options;
        if (!flags->numeric_names) options.class_names = data::fashion_mnist_folder_names();
        options.per_class = flags->per_class;
        std::vector<int64_t> written;
        for (const std::string& set : flags->sets) {
          const std::string stem = flags->source + "/" + set;
          auto existing = [](const std::string& path) {
            return std::ifstream(path + ".gz").good() ? path + ".gz" : path;
          };
          options.prefix = set;
          data::export_idx_as_image_folder(existing(stem + "-images-idx3-ubyte"), existing(stem + "-labels-idx1-ubyte"),
                                           flags->out, options, written);
        }
        const int64_t total = std::accumulate(written.begin(), written.end(), int64_t{0});
        log::info("wrote {} PNG images in {} class folders to {}", total, written.size(), flags->out);
        return 0;
      };
    }};

}  // namespace
}  // namespace tandem::app
