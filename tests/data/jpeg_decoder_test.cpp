// JPEG decoding through libjpeg-turbo against PIL's decoding of the same files (tests/fixtures/jpeg, written by
// make_jpeg_fixtures.py): baseline colour, grayscale, Adobe CMYK and progressive files, and the reduced sizes of
// the DCT-domain scaling. Then what the image folder builds on it: which crops allow a reduced decode, that a
// crop rendered from a reduced decode matches the full-size one, and that truncated or damaged JPEGs end in a
// one-line error naming the file, or are skipped and counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/scratch_dir.h"
#include "tandem/data/image.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/image_folder_split.h"
#include "tandem/data/image_transform.h"
#include "tandem/data/jpeg_decoder.h"
#include "tandem/util/error.h"

namespace tandem::data::jpeg_decoder_test {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const std::string& name) { return fs::path(TANDEM_FIXTURE_DIR) / "jpeg" / name; }

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file) << path;
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Largest difference between `image` and PIL's RGB bytes in `expected_file`, which must be the same size.
int largest_difference(const Image& image, const std::string& expected_file) {
  const std::vector<uint8_t> expected = read_bytes(fixture(expected_file));
  EXPECT_EQ(image.pixels.size(), expected.size()) << expected_file;
  if (image.pixels.size() != expected.size()) return 256;
  int largest = 0;
  for (size_t i = 0; i < expected.size(); ++i) largest = std::max(largest, std::abs(image.pixels[i] - expected[i]));
  return largest;
}

TEST(JpegDecoder, DecodesEveryKindAsPilDoes) {
  // PIL decodes with libjpeg-turbo too, so colour, gray and progressive files match byte for byte; CMYK goes
  // through each side's own conversion and may round differently.
  for (const auto& [name, tolerance] : std::vector<std::pair<std::string, int>>{
           {"photo", 0}, {"gray", 0}, {"progressive", 0}, {"cmyk", 1}}) {
    const Image image = read_image(fixture(name + ".jpg").string());
    EXPECT_EQ(image.width, 67) << name;
    EXPECT_EQ(image.height, 45) << name;
    const int difference = largest_difference(image, name + ".rgb");
    EXPECT_LE(difference, tolerance) << name << ": largest difference from PIL " << difference;
  }
}

TEST(JpegDecoder, ReducedDecodeIsPilsDraftMode) {
  const std::vector<uint8_t> bytes = read_bytes(fixture("photo.jpg"));
  const JpegHeader header = read_jpeg_header(bytes.data(), bytes.size());
  EXPECT_EQ(header.width, 67);
  EXPECT_EQ(header.height, 45);
  // Sizes round up: 67 / 2 -> 34, 45 / 8 -> 6.
  const Image half = decode_jpeg(bytes.data(), bytes.size(), 2);
  EXPECT_EQ(half.width, 34);
  EXPECT_EQ(half.height, 23);
  EXPECT_EQ(largest_difference(half, "photo_half.rgb"), 0);
  const Image eighth = decode_jpeg(bytes.data(), bytes.size(), 8);
  EXPECT_EQ(eighth.width, 9);
  EXPECT_EQ(eighth.height, 6);
  EXPECT_EQ(largest_difference(eighth, "photo_eighth.rgb"), 0);
}

TEST(JpegDecoder, CropAllowsAReductionOnlyWhenBothSidesAreThatManyTimesTheOutput) {
  EXPECT_EQ(dct_reduction({0, 0, 447, 1000, false}, 224), 1);
  EXPECT_EQ(dct_reduction({0, 0, 448, 448, false}, 224), 2);
  EXPECT_EQ(dct_reduction({0, 0, 1000, 500, false}, 224), 2);
  EXPECT_EQ(dct_reduction({0, 0, 128, 128, false}, 32), 4);
  EXPECT_EQ(dct_reduction({0, 0, 4000, 3000, false}, 32), 8);  // 1/8 is the smallest libjpeg offers
}

// One crop rendered from the fixture decoded at full size and at 1/2, the output smaller than the reduced crop
// as dct_reduction ensures: both see the same picture, so they agree closely, where a crop mapped to the wrong
// place on the reduced image would not (a crop elsewhere shows how far apart two places are).
TEST(JpegDecoder, CropFromAReducedDecodeMatchesTheFullSizeOne) {
  const std::vector<uint8_t> bytes = read_bytes(fixture("photo.jpg"));
  const Image full = decode_jpeg(bytes.data(), bytes.size(), 1);
  const Image half = decode_jpeg(bytes.data(), bytes.size(), 2);
  ImageTransformOptions options;
  options.image_size = 8;
  options.mean = {0, 0, 0};
  options.std = {1, 1, 1};
  const CropPlan crop{20, 6, 40, 36, /*flip=*/true};
  std::vector<float> from_full(3 * 8 * 8), from_half(3 * 8 * 8), elsewhere(3 * 8 * 8);
  render_crop(full, 67, 45, crop, options, from_full.data());
  render_crop(half, 67, 45, crop, options, from_half.data());
  render_crop(full, 67, 45, {0, 0, 40, 36, true}, options, elsewhere.data());
  double mean_difference = 0, mean_difference_elsewhere = 0;
  for (size_t i = 0; i < from_full.size(); ++i) {
    mean_difference += std::abs(from_full[i] - from_half[i]) / from_full.size();
    mean_difference_elsewhere += std::abs(from_full[i] - elsewhere[i]) / from_full.size();
  }
  EXPECT_LT(mean_difference, 0.03) << "values in [0, 1]";
  EXPECT_GT(mean_difference_elsewhere, 2 * mean_difference) << "the check cannot tell crops apart";
}

TEST(JpegDecoder, TruncatedAndDamagedFilesAreRefusedNamingTheFile) {
  const testing::ScratchDir dir;
  const std::vector<uint8_t> bytes = read_bytes(fixture("photo.jpg"));
  std::vector<uint8_t> damaged = bytes;
  // Scan data overwritten from the middle on: markers that cannot appear there.
  std::fill(damaged.begin() + damaged.size() / 2, damaged.end() - 2, 0xff);
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
      {"truncated.jpg", std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() * 2 / 3)},
      {"header_only.jpg", std::vector<uint8_t>(bytes.begin(), bytes.begin() + 20)},
      {"damaged.jpg", damaged},
      {"start_marker_only.jpg", {0xff, 0xd8}},
  };
  for (const auto& [name, content] : files) {
    const fs::path path = fs::path(dir.path()) / name;
    write_bytes(path, content);
    try {
      read_image(path.string());
      ADD_FAILURE() << name << " was decoded";
    } catch (const InvalidArgument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("cannot decode image " + path.string()), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
}

TEST(JpegDecoder, StrayBytesBeforeAMarkerLoseNoPixelAndAreKept) {
  const testing::ScratchDir dir;
  std::vector<uint8_t> bytes = read_bytes(fixture("photo.jpg"));
  // Three bytes between the last table and the start of scan, where libjpeg skips them with a warning.
  const std::vector<uint8_t> start_of_scan = {0xff, 0xda};
  const auto at = std::search(bytes.begin(), bytes.end(), start_of_scan.begin(), start_of_scan.end());
  ASSERT_NE(at, bytes.end());
  bytes.insert(at, {0x00, 0x2a, 0x00});
  const fs::path path = fs::path(dir.path()) / "stray.jpg";
  write_bytes(path, bytes);
  const Image image = read_image(path.string());
  EXPECT_EQ(largest_difference(image, "photo.rgb"), 0);
}

TEST(JpegDecoder, ImageFolderSkipsAndCountsTruncatedJpegs) {
  const testing::ScratchDir dir;
  const std::vector<uint8_t> bytes = read_bytes(fixture("photo.jpg"));
  const fs::path root(dir.path());
  write_bytes(root / "cat" / "a.jpg", bytes);
  write_bytes(root / "cat" / "b.jpg", std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  write_bytes(root / "cat" / "c.jpg", read_bytes(fixture("progressive.jpg")));
  ImageFolderOptions options;
  options.transform.image_size = 16;
  options.transform.train = true;
  options.num_threads = 2;
  const auto samples = read_split_data(dir.path(), 0.0).train;
  ImageFolderDataset strict(samples, options);
  try {
    strict.get_batch({0, 1, 2});
    ADD_FAILURE() << "a truncated JPEG was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("b.jpg"), std::string::npos) << error.what();
  }
  options.skip_bad_images = true;
  ImageFolderDataset lenient(samples, options);
  const Batch batch = lenient.get_batch({0, 1, 2});
  EXPECT_EQ(batch.indices, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(lenient.skipped_images(), 1);
  EXPECT_TRUE(torch::isfinite(batch.data).all().item<bool>());
}

}  // namespace
}  // namespace tandem::data::jpeg_decoder_test
