// The image-folder data set on tiny folders of PNGs the tests write themselves: class order, a reproducible
// stratified split, RGB conversion of grayscale and RGBA files, batches, reproducible augmentation, corrupt files
// (error naming the file, or skip-and-count), the class list, and the IDX-to-folder export.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include "tandem/data/export_image_folder.h"
#include "tandem/data/image.h"
#include "tandem/data/image_folder.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("tandem_image_folder_" + std::string(info->name()) + "_" +
                                         std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

// A width x height RGB PNG whose pixels vary with position and `tone`, so crops and flips change the result.
void write_rgb(const fs::path& path, int width, int height, int tone) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &pixels[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>(tone), p[1] = static_cast<uint8_t>(x * 255 / width);
      p[2] = static_cast<uint8_t>(y * 255 / height);
    }
  }
  fs::create_directories(path.parent_path());
  write_png(path.string(), pixels.data(), width, height, 3);
}

// Folder with `counts[name]` images in class folder `name`.
void make_folder(const fs::path& root, const std::map<std::string, int>& counts) {
  int tone = 0;
  for (const auto& [name, count] : counts) {
    for (int i = 0; i < count; ++i) write_rgb(root / name / ("img" + std::to_string(i) + ".png"), 12, 10, tone += 7);
  }
}

ImageFolderOptions plain_options(int64_t size) {
  ImageFolderOptions options;
  options.transform.image_size = size;
  options.transform.mean = {0, 0, 0};
  options.transform.std = {1, 1, 1};
  options.num_threads = 3;
  return options;
}

TEST(ImageFolder, ClassesSortedAndOtherFilesIgnored) {
  TempDir dir;
  make_folder(dir.path(), {{"zebra", 2}, {"apple", 3}, {"mango", 1}});
  std::ofstream(dir.path() / "apple" / "notes.txt") << "not an image";
  fs::create_directories(dir.path() / ".hidden");
  const ImageFolderSplit split = read_split_data(dir.str(), 0.0, 0);
  EXPECT_EQ(split.classes, (std::vector<std::string>{"apple", "mango", "zebra"}));
  ASSERT_EQ(split.train.size(), 6u);
  EXPECT_TRUE(split.val.empty());
  for (const auto& sample : split.train) {
    EXPECT_EQ(fs::path(sample.path).parent_path().filename().string(), split.classes[sample.label]);
  }
}

TEST(ImageFolder, SplitIsReproducibleAndStratified) {
  TempDir dir;
  const std::map<std::string, int> counts{{"a", 10}, {"b", 23}, {"c", 7}};
  make_folder(dir.path(), counts);
  const ImageFolderSplit first = read_split_data(dir.str(), 0.2, 42);
  const ImageFolderSplit again = read_split_data(dir.str(), 0.2, 42);
  const ImageFolderSplit other = read_split_data(dir.str(), 0.2, 43);
  auto paths = [](const std::vector<ImageSample>& samples) {
    std::vector<std::string> out;
    for (const auto& s : samples) out.push_back(s.path);
    return out;
  };
  EXPECT_EQ(paths(first.val), paths(again.val));
  EXPECT_EQ(paths(first.train), paths(again.train));
  EXPECT_NE(paths(first.val), paths(other.val));

  // floor(count * 0.2) per class in val, the rest in train, every file exactly once.
  std::map<int64_t, int> val_per_class, train_per_class;
  for (const auto& s : first.val) ++val_per_class[s.label];
  for (const auto& s : first.train) ++train_per_class[s.label];
  EXPECT_EQ(val_per_class, (std::map<int64_t, int>{{0, 2}, {1, 4}, {2, 1}}));
  EXPECT_EQ(train_per_class, (std::map<int64_t, int>{{0, 8}, {1, 19}, {2, 6}}));
  std::set<std::string> all;
  for (const auto& p : paths(first.train)) all.insert(p);
  for (const auto& p : paths(first.val)) all.insert(p);
  EXPECT_EQ(all.size(), 40u);

  // Adding a class leaves the other classes' split alone.
  make_folder(dir.path(), {{"d", 5}});
  const ImageFolderSplit grown = read_split_data(dir.str(), 0.2, 42);
  std::vector<std::string> grown_val;
  for (const auto& s : grown.val) {
    if (s.label < 3) grown_val.push_back(s.path);
  }
  EXPECT_EQ(grown_val, paths(first.val));
}

TEST(ImageFolder, SplitErrors) {
  TempDir dir;
  EXPECT_THROW(read_split_data(dir.str() + "/missing"), InvalidArgument);
  EXPECT_THROW(read_split_data(dir.str()), InvalidArgument);  // no class folders
  make_folder(dir.path(), {{"a", 2}});
  fs::create_directories(dir.path() / "empty");
  try {
    read_split_data(dir.str());
    ADD_FAILURE() << "an empty class folder was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_split_data(dir.str(), 1.0), InvalidArgument);
}

TEST(ImageFolder, GrayscaleAndRgbaBecomeRgb) {
  TempDir dir;
  const std::vector<uint8_t> gray(8 * 8, 100);
  std::vector<uint8_t> rgba;
  for (int i = 0; i < 8 * 8; ++i) rgba.insert(rgba.end(), {10, 20, 30, 0});  // alpha is dropped, not blended
  fs::create_directories(dir.path() / "x");
  write_png((dir.path() / "x" / "gray.png").string(), gray.data(), 8, 8, 1);
  write_png((dir.path() / "x" / "rgba.png").string(), rgba.data(), 8, 8, 4);
  const Image decoded = read_image((dir.path() / "x" / "gray.png").string());
  EXPECT_EQ(decoded.pixels.size(), 8u * 8u * 3u);

  ImageFolderDataset dataset(read_split_data(dir.str(), 0.0).train, plain_options(4));
  const torch::Tensor g = dataset.get_image(0), c = dataset.get_image(1);  // gray.png, rgba.png (sorted)
  EXPECT_EQ(g.sizes(), (std::vector<int64_t>{3, 4, 4}));
  EXPECT_TRUE(torch::allclose(g, torch::full({3, 4, 4}, 100 / 255.0f), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(c[0], torch::full({4, 4}, 10 / 255.0f), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(c[1], torch::full({4, 4}, 20 / 255.0f), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(c[2], torch::full({4, 4}, 30 / 255.0f), 0, 1e-6));
}

TEST(ImageFolder, BatchesAreNormalisedWithLabels) {
  TempDir dir;
  make_folder(dir.path(), {{"a", 3}, {"b", 2}});
  const auto samples = read_split_data(dir.str(), 0.0).train;
  ImageFolderOptions options;  // ImageNet normalisation
  options.transform.image_size = 6;
  ImageFolderDataset dataset(samples, options);
  EXPECT_EQ(dataset.size(), 5);
  const Batch batch = dataset.get_batch({4, 0, 3});
  EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{3, 3, 6, 6}));
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({1, 0, 1}, torch::kLong)));
  EXPECT_EQ(batch.indices, (std::vector<int64_t>{4, 0, 3}));
  // Channel 0 of image 0 is the constant tone 7: (7/255 - 0.485) / 0.229.
  EXPECT_NEAR(batch.data[1][0].mean().item<float>(), (7 / 255.0f - 0.485f) / 0.229f, 1e-4);
  EXPECT_THROW(dataset.get_batch({5}), InvalidArgument);
}

// Batches live in recycled buffers (image_batch_buffers.h): a batch still held keeps its values while later
// ones are made, and a released batch's memory serves the next one.
TEST(ImageFolder, HeldBatchesKeepTheirValuesAndReleasedOnesAreReused) {
  TempDir dir;
  make_folder(dir.path(), {{"a", 4}});
  ImageFolderDataset dataset(read_split_data(dir.str(), 0.0).train, plain_options(6));
  const Batch first = dataset.get_batch({0, 1});
  const torch::Tensor expected = first.data.clone();
  for (int i = 0; i < 4; ++i) dataset.get_batch({2, 3});
  EXPECT_TRUE(torch::equal(first.data, expected)) << "a later batch overwrote one still held";

  const void* memory = nullptr;
  {
    const Batch released = dataset.get_batch({2, 3});
    memory = released.data.data_ptr();
  }
  const Batch next = dataset.get_batch({1, 2});
  EXPECT_EQ(next.data.data_ptr(), memory);
  EXPECT_TRUE(torch::equal(next.data[0], expected[1]));
}

TEST(ImageFolder, TrainingAugmentationIsReproducibleAcrossThreadCounts) {
  TempDir dir;
  make_folder(dir.path(), {{"a", 6}});
  const auto samples = read_split_data(dir.str(), 0.0).train;
  ImageFolderOptions options = plain_options(8);
  options.transform.train = true;
  options.seed = 9;
  ImageFolderDataset threaded(samples, options);
  options.num_threads = 1;
  ImageFolderDataset single(samples, options);
  const std::vector<int64_t> all{0, 1, 2, 3, 4, 5};
  const torch::Tensor epoch0 = threaded.get_batch(all).data;
  EXPECT_TRUE(torch::equal(epoch0, single.get_batch(all).data));
  EXPECT_TRUE(torch::equal(epoch0, threaded.get_batch(all).data));
  threaded.set_epoch(1);
  EXPECT_FALSE(torch::equal(epoch0, threaded.get_batch(all).data)) << "a new epoch should draw new crops";

  // Validation transform is deterministic and ignores the epoch.
  options.transform.train = false;
  ImageFolderDataset val(samples, options);
  const torch::Tensor v0 = val.get_batch(all).data;
  val.set_epoch(5);
  EXPECT_TRUE(torch::equal(v0, val.get_batch(all).data));
}

TEST(ImageFolder, CorruptFileNamedOrSkipped) {
  TempDir dir;
  make_folder(dir.path(), {{"a", 3}});
  std::ofstream(dir.path() / "a" / "img1.png", std::ios::trunc) << "this is not a PNG";
  const auto samples = read_split_data(dir.str(), 0.0).train;
  ImageFolderDataset strict(samples, plain_options(4));
  try {
    strict.get_batch({0, 1, 2});
    ADD_FAILURE() << "a corrupt image was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("img1.png"), std::string::npos) << e.what();
  }

  ImageFolderOptions options = plain_options(4);
  options.skip_bad_images = true;
  ImageFolderDataset lenient(samples, options);
  const Batch batch = lenient.get_batch({0, 1, 2});
  EXPECT_EQ(batch.data.size(0), 2);
  EXPECT_EQ(batch.indices, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(batch.target.size(0), 2);
  EXPECT_EQ(lenient.skipped_images(), 1);
  EXPECT_TRUE(torch::equal(batch.data[1], strict.get_image(2)));
}

TEST(ImageFolder, ClassListRoundTrip) {
  TempDir dir;
  const std::vector<std::string> classes{"daisy", "dandelion", "roses"};
  const std::string path = (dir.path() / "class_indices.json").string();
  write_class_list(classes, path);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"0\": \"daisy\""), std::string::npos) << text;
  EXPECT_EQ(read_class_list(path), classes);
}

// Writes a plain (uncompressed) IDX file of unsigned bytes.
void write_idx(const fs::path& path, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& values) {
  std::ofstream out(path, std::ios::binary);
  const uint8_t magic[4] = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  out.write(reinterpret_cast<const char*>(magic), 4);
  for (uint32_t d : dims) {
    const uint8_t big_endian[4] = {static_cast<uint8_t>(d >> 24), static_cast<uint8_t>(d >> 16),
                                   static_cast<uint8_t>(d >> 8), static_cast<uint8_t>(d)};
    out.write(reinterpret_cast<const char*>(big_endian), 4);
  }
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size()));
}

TEST(ExportImageFolder, WritesPerClassFoldersUpToLimit) {
  TempDir dir;
  std::vector<uint8_t> pixels(5 * 4 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 4);
  write_idx(dir.path() / "images", {5, 4, 3}, pixels);
  write_idx(dir.path() / "labels", {5}, {1, 0, 1, 1, 0});
  ExportImageFolderOptions options;
  options.class_names = {"zero", "one"};
  options.per_class = 2;
  std::vector<int64_t> written;
  const std::string out = (dir.path() / "out").string();
  EXPECT_EQ(export_idx_as_image_folder((dir.path() / "images").string(), (dir.path() / "labels").string(), out,
                                       options, written),
            4);
  EXPECT_EQ(written, (std::vector<int64_t>{2, 2}));
  const ImageFolderSplit split = read_split_data(out, 0.0);
  EXPECT_EQ(split.classes, (std::vector<std::string>{"one", "zero"}));
  // Image 1 (label 0, "zero") decodes back to its bytes, as gray RGB. 3 wide, 4 high.
  const Image image = read_image(out + "/zero/img_1.png");
  ASSERT_EQ(image.width, 3);
  ASSERT_EQ(image.height, 4);
  for (int p = 0; p < 12; ++p) EXPECT_EQ(image.pixels[p * 3 + 1], pixels[12 + p]) << "pixel " << p;
}

}  // namespace
}  // namespace tandem::data
