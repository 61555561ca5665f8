#include "tandem/data/export_image_folder.h"

#include <filesystem>

#include "tandem/data/idx_file.h"
#include "tandem/data/image.h"
#include "tandem/util/error.h"

namespace tandem::data {

std::vector<std::string> fashion_mnist_folder_names() {
  return {"0_t-shirt-top", "1_trouser", "2_pullover", "3_dress", "4_coat",
          "5_sandal",      "6_shirt",   "7_sneaker",  "8_bag",   "9_ankle-boot"};
}

int64_t export_idx_as_image_folder(const std::string& images_path, const std::string& labels_path,
                                   const std::string& out_dir, const ExportImageFolderOptions& options,
                                   std::vector<int64_t>& written) {
  const IdxArray images = read_idx_file(images_path);
  const IdxArray labels = read_idx_file(labels_path);
  if (images.dims.size() != 3 || labels.dims.size() != 1 || images.dims[0] != labels.dims[0]) {
    throw InvalidArgument("expected IDX images [N, H, W] and labels [N] with the same N, got " + images_path +
                          " and " + labels_path);
  }
  const int64_t count = images.dims[0], height = images.dims[1], width = images.dims[2];
  int64_t files = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t label = labels.values[i];
    if (static_cast<int64_t>(written.size()) <= label) written.resize(label + 1, 0);
    if (options.per_class && written[label] >= *options.per_class) continue;
    const std::string folder_name = label < static_cast<int64_t>(options.class_names.size())
                                        ? options.class_names[label]
                                        : std::to_string(label);
    const std::filesystem::path folder = std::filesystem::path(out_dir) / folder_name;
    std::error_code error;
    std::filesystem::create_directories(folder, error);
    if (error) throw Error("cannot create folder " + folder.string() + ": " + error.message());
    write_png((folder / (options.prefix + "_" + std::to_string(i) + ".png")).string(),
              images.values.data() + i * height * width, static_cast<int>(width), static_cast<int>(height), 1);
    ++written[label];
    ++files;
  }
  return files;
}

}  // namespace tandem::data
