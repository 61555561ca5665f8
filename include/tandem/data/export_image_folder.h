#pragma once
// Writes an IDX image/label pair (MNIST, Fashion-MNIST) out as an image folder: one sub-folder per class of PNG
// files, the layout ImageFolderDataset reads. No photo data set ships with Debian; this turns the packaged
// Fashion-MNIST into real files for the image-folder workflow (`tandem export-images`).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::data {

// Fashion-MNIST's class names with the label as prefix, so that sorting folder names keeps label order.
std::vector<std::string> fashion_mnist_folder_names();

struct ExportImageFolderOptions {
  // Folder name per label; empty means the label's number.
  std::vector<std::string> class_names;
  // Stop writing a class after this many images, at least 1 (counting what earlier calls wrote: see `written`);
  // absent: all of them.
  std::optional<int64_t> per_class;
  // File names are PREFIX_INDEX.png, INDEX being the image's position in the IDX file.
  std::string prefix = "img";
};

// Reads `images_path` ([N, H, W] unsigned bytes) and `labels_path` ([N]), plain or gzipped, and writes grayscale
// PNGs to OUT_DIR/CLASS/PREFIX_INDEX.png, creating folders as needed. `written` (one count per label, grown as
// needed) is updated, so several IDX pairs can fill one folder up to per_class. Returns the number of files
// written. Throws InvalidArgument for unreadable or mismatched IDX files, Error when a file cannot be written.
int64_t export_idx_as_image_folder(const std::string& images_path, const std::string& labels_path,
                                   const std::string& out_dir, const ExportImageFolderOptions& options,
                                   std::vector<int64_t>& written);

}  // namespace tandem::data
