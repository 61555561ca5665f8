// IDX reading and MnistDataset on small files the test writes (plain and gzip), every error a user can meet,
// and a quick load of the real Fashion-MNIST when Debian's dataset-fashion-mnist is installed.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>
#include <zlib.h>

#include "support/tensor_values.h"
#include "tandem/data/idx_file.h"
#include "tandem/data/mnist_dataset.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

Bytes idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& values) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

uint32_t crc32_of(const Bytes& data) {
  uint32_t crc = 0xffffffffu;
  for (uint8_t byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// A valid gzip file built from stored (uncompressed) deflate blocks, so the test needs no compressor.
Bytes gzip_stored(const Bytes& data) {
  Bytes out = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  size_t offset = 0;
  do {
    const size_t len = std::min<size_t>(data.size() - offset, 65535);
    const bool last = offset + len == data.size();
    out.push_back(last ? 1 : 0);
    out.push_back(static_cast<uint8_t>(len));
    out.push_back(static_cast<uint8_t>(len >> 8));
    out.push_back(static_cast<uint8_t>(~len));
    out.push_back(static_cast<uint8_t>(~len >> 8));
    out.insert(out.end(), data.begin() + offset, data.begin() + offset + len);
    offset += len;
  } while (offset < data.size());
  const uint32_t crc = crc32_of(data);
  const uint32_t size = static_cast<uint32_t>(data.size());
  for (int shift : {0, 8, 16, 24}) out.push_back(static_cast<uint8_t>(crc >> shift));
  for (int shift : {0, 8, 16, 24}) out.push_back(static_cast<uint8_t>(size >> shift));
  return out;
}

// Real deflate compression: long runs of zeros shrink about a thousandfold, which is what a gzip bomb uses.
Bytes gzip_deflated(const Bytes& data) {
  z_stream stream;
  std::memset(&stream, 0, sizeof(stream));
  EXPECT_EQ(deflateInit2(&stream, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&stream, data.size()));
  stream.next_in = const_cast<Bytef*>(data.data());
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

class MnistFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_mnist_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // 5 images of 28x28 with pixel (i, r, c) = (i*31 + r*7 + c) % 256, labels 9,0,3,7,1.
    for (uint32_t i = 0; i < kCount; ++i) {
      for (uint32_t p = 0; p < 28 * 28; ++p) pixels_.push_back(static_cast<uint8_t>((i * 31 + (p / 28) * 7 + p % 28) % 256));
    }
    labels_ = {9, 0, 3, 7, 1};
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const Bytes& bytes) {
    std::ofstream file(dir_ / name, std::ios::binary);
    file.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  Bytes images_file(uint32_t count = kCount) const { return idx_bytes(0x08, {count, 28, 28}, pixels_); }
  Bytes labels_file() const { return idx_bytes(0x08, {kCount}, labels_); }

  // The error message MnistDataset throws for this folder's test split (fails the test if nothing is thrown).
  std::string load_error() const {
    try {
      MnistDataset dataset(dir_.string(), MnistSplit::kTest, kFashionMnistNormalization);
    } catch (const InvalidArgument& error) {
      return error.what();
    }
    ADD_FAILURE() << "expected InvalidArgument";
    return "";
  }

  static constexpr uint32_t kCount = 5;
  fs::path dir_;
  Bytes pixels_;
  Bytes labels_;
};

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' should contain '" << part << "'";
}

using testing::to_vector;

TEST_F(MnistFiles, LoadsPlainFilesScaledAndNormalised) {
  write("t10k-images-idx3-ubyte", images_file());
  write("t10k-labels-idx1-ubyte", labels_file());
  const Normalization norm{0.5, 0.25};
  MnistDataset dataset(dir_.string(), MnistSplit::kTest, norm);
  ASSERT_EQ(dataset.size(), 5);
  EXPECT_EQ(dataset.images().sizes().vec(), (std::vector<int64_t>{5, 1, 28, 28}));
  EXPECT_EQ(dataset.images().scalar_type(), torch::kFloat32);
  EXPECT_EQ(dataset.labels().scalar_type(), torch::kInt64);
  EXPECT_EQ(to_vector(dataset.labels()), (std::vector<int64_t>{9, 0, 3, 7, 1}));

  torch::Tensor expected = torch::empty({5, 1, 28, 28}, torch::kFloat32);
  float* out = expected.data_ptr<float>();
  for (size_t k = 0; k < pixels_.size(); ++k) out[k] = (pixels_[k] / 255.0f - 0.5f) / 0.25f;
  const double max_diff = (dataset.images() - expected).abs().max().item<double>();
  std::cout << "largest pixel difference: " << max_diff << "\n";
  EXPECT_LT(max_diff, 1e-6);
  // Pixel (image 2, row 3, col 4) = (62 + 21 + 4) % 256 = 87.
  EXPECT_NEAR(dataset.images()[2][0][3][4].item<float>(), (87 / 255.0 - 0.5) / 0.25, 1e-6);

  const Batch batch = dataset.get_batch({4, 0, 4});
  EXPECT_EQ(to_vector(batch.target), (std::vector<int64_t>{1, 9, 1}));
  EXPECT_TRUE(torch::equal(batch.data[1], dataset.images()[0]));
}

TEST_F(MnistFiles, LoadsGzipFilesLikePlainOnes) {
  write("train-images-idx3-ubyte.gz", gzip_stored(images_file()));
  write("train-labels-idx1-ubyte.gz", gzip_stored(labels_file()));
  write("t10k-images-idx3-ubyte", images_file());
  write("t10k-labels-idx1-ubyte", labels_file());
  MnistDataset zipped(dir_.string(), MnistSplit::kTrain, kMnistNormalization);
  MnistDataset plain(dir_.string(), MnistSplit::kTest, kMnistNormalization);
  EXPECT_TRUE(torch::equal(zipped.images(), plain.images()));
  EXPECT_TRUE(torch::equal(zipped.labels(), plain.labels()));
  expect_contains(zipped.images_path(), "train-images-idx3-ubyte.gz");

  // A gzip file larger than one stored block (65535 bytes) exercises multi-block streams.
  Bytes big(200000);
  std::mt19937 random(3);
  for (uint8_t& b : big) b = static_cast<uint8_t>(random());
  write("big.gz", gzip_stored(big));
  EXPECT_EQ(read_maybe_gzipped_file((dir_ / "big.gz").string()), big);
}

TEST_F(MnistFiles, MissingFileNamesIt) {
  write("t10k-images-idx3-ubyte", images_file());
  const std::string error = load_error();
  expect_contains(error, "t10k-labels-idx1-ubyte");
  expect_contains(error, "not found");
}

TEST_F(MnistFiles, BadMagicNamesTheFile) {
  Bytes bad = images_file();
  bad[0] = 0x12;
  write("t10k-images-idx3-ubyte", bad);
  write("t10k-labels-idx1-ubyte", labels_file());
  std::string error = load_error();
  expect_contains(error, "t10k-images-idx3-ubyte");
  expect_contains(error, "bad magic");

  // A labels file where the images should be: right format, wrong number of dimensions.
  write("t10k-images-idx3-ubyte", labels_file());
  error = load_error();
  expect_contains(error, "t10k-images-idx3-ubyte");
  expect_contains(error, "bad magic");

  // An element type other than unsigned byte (0x0D is float).
  write("t10k-images-idx3-ubyte", idx_bytes(0x0D, {kCount, 28, 28}, pixels_));
  expect_contains(load_error(), "element type");
}

TEST_F(MnistFiles, TruncatedDataNamesTheFile) {
  Bytes cut = images_file();
  cut.resize(cut.size() - 100);
  write("t10k-images-idx3-ubyte", cut);
  write("t10k-labels-idx1-ubyte", labels_file());
  std::string error = load_error();
  expect_contains(error, "t10k-images-idx3-ubyte");
  expect_contains(error, "truncated");

  write("t10k-images-idx3-ubyte", Bytes{0, 0, 8, 3, 0, 0});  // header cut inside the dimensions
  expect_contains(load_error(), "truncated");
}

TEST_F(MnistFiles, CountMismatchNamesBothFiles) {
  Bytes four_images = idx_bytes(0x08, {4, 28, 28}, Bytes(pixels_.begin(), pixels_.begin() + 4 * 784));
  write("t10k-images-idx3-ubyte", four_images);
  write("t10k-labels-idx1-ubyte", labels_file());
  const std::string error = load_error();
  expect_contains(error, "4 images");
  expect_contains(error, "5 labels");
  expect_contains(error, "t10k-labels-idx1-ubyte");
}

TEST_F(MnistFiles, CorruptOrTruncatedGzipNamesTheFile) {
  write("t10k-labels-idx1-ubyte", labels_file());
  Bytes corrupt = gzip_stored(images_file());
  corrupt[corrupt.size() - 6] ^= 0xff;  // inside the CRC32 trailer
  write("t10k-images-idx3-ubyte.gz", corrupt);
  std::string error = load_error();
  expect_contains(error, "t10k-images-idx3-ubyte.gz");
  expect_contains(error, "corrupt gzip");

  Bytes truncated = gzip_stored(images_file());
  truncated.resize(truncated.size() / 2);
  write("t10k-images-idx3-ubyte.gz", truncated);
  error = load_error();
  expect_contains(error, "t10k-images-idx3-ubyte.gz");
  expect_contains(error, "truncated");
}

TEST_F(MnistFiles, GzipBombIsRefusedWhileInflating) {
  write("t10k-images-idx3-ubyte", images_file());
  // A valid header for 5 labels (13 bytes with the data), then 64 MiB of zeros that it does not declare.
  Bytes bomb = labels_file();
  bomb.resize(bomb.size() + (64 << 20));
  Bytes compressed = gzip_deflated(bomb);
  ASSERT_LT(compressed.size(), 100u << 10);
  write("t10k-labels-idx1-ubyte.gz", compressed);
  std::string error = load_error();
  expect_contains(error, "t10k-labels-idx1-ubyte.gz");
  expect_contains(error, "decompresses to more than 13 bytes; the file is not an IDX file or is corrupt");

  // Refused as soon as the output passes the limit: with its second half cut off, the stream never reaches
  // the truncation, because inflating stops long before.
  compressed.resize(compressed.size() / 2);
  write("t10k-labels-idx1-ubyte.gz", compressed);
  expect_contains(load_error(), "decompresses to more than 13 bytes");
}

// One damaged byte in a labels file made a 201-class model that trained without a word. A label must lie
// below the number of classes (10 unless the caller says more); the error names the file, the value and where.
TEST_F(MnistFiles, LabelOutsideTheClassesNamesTheFileTheValueAndItsIndex) {
  write("t10k-images-idx3-ubyte", images_file());
  labels_[3] = 200;
  write("t10k-labels-idx1-ubyte", labels_file());
  const std::string error = load_error();
  expect_contains(error, (dir_ / "t10k-labels-idx1-ubyte").string() + ": label 200 at index 3 is outside the 10 classes 0-9");
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;

  MnistDataset more_classes(dir_.string(), MnistSplit::kTest, kFashionMnistNormalization, /*num_classes=*/201);
  EXPECT_EQ(to_vector(more_classes.labels()), (std::vector<int64_t>{9, 0, 3, 200, 1}));
  EXPECT_THROW(MnistDataset(dir_.string(), MnistSplit::kTest, kFashionMnistNormalization, /*num_classes=*/200),
               InvalidArgument)
      << "label 200 is the 201st class";
}

TEST(Normalization, GuessesFromFolderAndParsesFlag) {
  EXPECT_DOUBLE_EQ(guess_normalization("/usr/share/datasets/fashion-mnist").mean, 0.2860);
  EXPECT_DOUBLE_EQ(guess_normalization("data/Fashion_MNIST").std, 0.3530);
  EXPECT_DOUBLE_EQ(guess_normalization("/data/MNIST/raw").mean, 0.1307);
  EXPECT_DOUBLE_EQ(guess_normalization("/somewhere/else").mean, 0.2860);
  const Normalization parsed = parse_normalization("0.5,0.25");
  EXPECT_DOUBLE_EQ(parsed.mean, 0.5);
  EXPECT_DOUBLE_EQ(parsed.std, 0.25);
  EXPECT_THROW(parse_normalization("0.5"), InvalidArgument);
  EXPECT_THROW(parse_normalization("a,b"), InvalidArgument);
  EXPECT_THROW(parse_normalization("0.5,0"), InvalidArgument);
  EXPECT_EQ(parse_mnist_split("t10k"), MnistSplit::kTest);
  EXPECT_THROW(parse_mnist_split("validation"), InvalidArgument);
}

TEST(FashionMnist, RealDatasetLoadsWhenInstalled) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const Normalization norm = guess_normalization(dir);
  MnistDataset train(dir, MnistSplit::kTrain, norm);
  MnistDataset test(dir, MnistSplit::kTest, norm);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.images().sizes().vec(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(train.labels().min().item<int64_t>(), 0);
  EXPECT_EQ(train.labels().max().item<int64_t>(), 9);
  EXPECT_EQ(test.labels().min().item<int64_t>(), 0);
  EXPECT_EQ(test.labels().max().item<int64_t>(), 9);
  // Normalised with the data set's own statistics, the training images have mean ~0 and std ~1.
  const double mean = train.images().mean().item<double>();
  const double std = train.images().std().item<double>();
  std::cout << "Fashion-MNIST train after normalisation: mean " << mean << " std " << std << "\n";
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std, 1.0, 0.01);
}

}  // namespace
}  // namespace tandem::data
