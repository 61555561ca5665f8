// safetensors: round trips for every dtype, a file PyTorch wrote (tests/fixtures/make_safetensors_fixture.py),
// the skip-and-list loading filter (by shape, where the seeds compared element counts), --strict, clear errors
// on damaged or deliberately crafted files, and a save whose directory cannot be synced reported as an error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/nn/cnn_net.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

// While set, fsync of a directory fails with EIO, as on a failing disk (see the fsync defined below).
std::atomic<bool> fail_directory_fsync{false};

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "tandem_safetensors_" + std::to_string(::getpid()) + "_" + name;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

bool contains(const std::vector<std::string>& items, const std::string& prefix) {
  for (const auto& item : items) {
    if (item.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Expects InvalidArgument whose message names the file and contains `what`.
void expect_load_error(const std::string& path, const std::string& what) {
  try {
    load_safetensors(path);
    ADD_FAILURE() << "loading " << path << " should fail with '" << what << "'";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  const std::string path = temp_path("round_trip.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"f32", torch::arange(12, torch::kFloat32).reshape({3, 4}) * 0.5},
      {"f64", torch::tensor({1.0 / 3.0, -2.5}, torch::kFloat64)},
      {"f16", torch::tensor({1.5, -0.25}).to(torch::kFloat16)},
      {"bf16", torch::tensor({0.5, 8.0}).to(torch::kBFloat16)},
      {"i64", torch::tensor({int64_t{1} << 40, int64_t{-3}})},
      {"i32", torch::tensor({7, -7}, torch::kInt32)},
      {"i8", torch::tensor({-128, 127}, torch::kInt8)},
      {"u8", torch::tensor({0, 255}, torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.25)},
      {"empty", torch::zeros({0, 5})},
      {"strided", torch::arange(6, torch::kFloat32).reshape({2, 3}).t()},
  };
  save_safetensors(path, tensors, {{"epoch", "3"}, {"note", "hello"}});
  TensorFile file = load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first) << "file order follows write order";
    EXPECT_EQ(file.tensors[i].second.scalar_type(), tensors[i].second.scalar_type()) << tensors[i].first;
    EXPECT_TRUE(torch::equal(file.tensors[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"epoch", "3"}, {"note", "hello"}}));
  // The header length field plus an 8-aligned header: data starts at a multiple of 8.
  const std::string bytes = read_bytes(path);
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(header % 8, 0u);
  std::remove(path.c_str());
}

TEST(Safetensors, ReadsTheFileWrittenFromPyTorch) {
  const std::string path = std::string(TANDEM_FIXTURE_DIR) + "/pytorch_small.safetensors";
  TensorFile file = load_safetensors(path);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  const auto known = [](std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    return (torch::arange(numel, torch::kFloat64) * 0.25 - 1.0).reshape(shape).to(torch::kFloat32);
  };
  EXPECT_TRUE(torch::equal(file.find("conv.weight"), known({2, 1, 3, 3})));
  EXPECT_TRUE(torch::equal(file.find("conv.bias"), known({2})));
  EXPECT_TRUE(torch::equal(file.find("fc.weight"), known({3, 4})));
  EXPECT_TRUE(torch::equal(file.find("fc.bias"), known({3})));
  EXPECT_TRUE(torch::equal(file.find("steps"), torch::tensor({int64_t{7}})));
  EXPECT_TRUE(torch::equal(file.find("extra.f64"), torch::tensor({0.0, 0.5, 1.0}, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(file.find("extra.f16"), torch::tensor({1.5, -2.0}).to(torch::kFloat16)));
  EXPECT_TRUE(torch::equal(file.find("extra.bf16"), torch::tensor({0.5, 4.0}).to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(file.find("extra.i32"), torch::tensor({1, -2, 3, -4}, torch::kInt32).reshape({2, 2})));
  EXPECT_TRUE(torch::equal(file.find("extra.u8"), torch::tensor({0, 255}, torch::kUInt8)));
  EXPECT_TRUE(torch::equal(file.find("extra.bool"), torch::tensor({true, false, true})));
}

TEST(Safetensors, LoadWeightsSkipsAndListsMismatchedTensors) {
  torch::manual_seed(0);
  nn::CnnNet source;
  nn::CnnNetOptions five_classes;
  five_classes.num_classes = 5;
  nn::CnnNet target(five_classes);
  const std::string path = temp_path("cnn.safetensors");
  auto state = named_state(*source);
  state.emplace_back("aux.extra", torch::ones({2}));
  save_safetensors(path, state);

  const torch::Tensor before = target->named_parameters()["output.weight"].clone();
  LoadReport report = load_weights(*target, path);
  EXPECT_EQ(report.loaded.size(), 10u);  // all but output.weight/bias (10 vs 5 classes)
  EXPECT_TRUE(contains(report.skipped, "output.weight (shape [10, 64] in the file, [5, 64] in the model)"));
  EXPECT_TRUE(contains(report.skipped, "output.bias"));
  EXPECT_TRUE(contains(report.skipped, "aux.extra (not in the model)"));
  EXPECT_EQ(report.skipped.size(), 3u) << "each unused file tensor once";
  EXPECT_TRUE(report.missing.empty()) << "output.weight/bias are in the file, skipped for their shape";
  EXPECT_TRUE(torch::equal(target->named_parameters()["conv1.weight"], source->named_parameters()["conv1.weight"]));
  EXPECT_TRUE(torch::equal(target->named_parameters()["output.weight"], before)) << "skipped tensors stay untouched";

  // --strict: the same file is refused, naming what does not fit, and nothing is copied.
  nn::CnnNet strict_target(five_classes);
  const torch::Tensor strict_before = strict_target->named_parameters()["conv1.weight"].clone();
  try {
    load_weights(*strict_target, path, /*strict=*/true);
    FAIL() << "strict load should fail";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("output.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("aux.extra"), std::string::npos) << message;
  }
  EXPECT_TRUE(torch::equal(strict_target->named_parameters()["conv1.weight"], strict_before));
  std::remove(path.c_str());
}

// A tensor with the model's element count but another shape (here fc.weight transposed) is refused, not
// reshaped: its values would land in the wrong places. The seeds' element-count filter let it through.
TEST(Safetensors, LoadWeightsRefusesASameSizedTensorOfAnotherShape) {
  torch::nn::Linear target(torch::nn::LinearOptions(3, 2));  // weight [2, 3]
  const torch::Tensor bias = torch::tensor({0.5f, -0.5f});
  const std::string path = temp_path("transposed.safetensors");
  save_safetensors(path, {{"weight", torch::arange(6, torch::kFloat32).reshape({3, 2})}, {"bias", bias}});
  const std::string expected_skip = "weight (shape [3, 2] in the file, [2, 3] in the model)";

  const torch::Tensor weight_before = target->weight.detach().clone();
  LoadReport report = load_weights(*target, path);
  EXPECT_EQ(report.skipped, (std::vector<std::string>{expected_skip}));
  EXPECT_TRUE(report.missing.empty()) << "the file has a weight, of the wrong shape: skipped, not missing";
  EXPECT_EQ(report.loaded, (std::vector<std::string>{"bias"}));
  EXPECT_TRUE(torch::equal(target->weight, weight_before)) << "the refused tensor stays untouched";
  EXPECT_TRUE(torch::equal(target->bias, bias));

  torch::nn::Linear strict_target(torch::nn::LinearOptions(3, 2));
  const torch::Tensor strict_bias_before = strict_target->bias.detach().clone();
  try {
    load_weights(*strict_target, path, /*strict=*/true);
    ADD_FAILURE() << "strict load accepted a transposed weight";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(expected_skip), std::string::npos) << message;
  }
  EXPECT_TRUE(torch::equal(strict_target->bias, strict_bias_before)) << "strict copies nothing when it refuses";
  std::remove(path.c_str());
}

// PyTorch users save the state dict of their DistributedDataParallel (or DataParallel) wrapper, whose names
// all start with "module."; such a file loaded nothing and training started from scratch with exit 0.
TEST(Safetensors, LoadWeightsTakesAStateDictSavedFromAPyTorchWrapper) {
  torch::manual_seed(1);
  nn::CnnNet source;
  nn::CnnNet target;
  const std::string path = temp_path("ddp_state_dict.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> wrapped;
  for (const auto& [name, tensor] : named_state(*source)) wrapped.emplace_back("module." + name, tensor);
  save_safetensors(path, wrapped);

  const LoadReport report = load_weights(*target, path, /*strict=*/true);
  EXPECT_EQ(report.loaded.size(), wrapped.size());
  EXPECT_TRUE(report.skipped.empty());
  EXPECT_TRUE(report.missing.empty());
  EXPECT_TRUE(contains(report.loaded, "conv1.weight")) << "loaded lists the model's names";
  const auto loaded = named_state(*target);
  const auto expected = named_state(*source);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded[i].second, expected[i].second)) << expected[i].first;
  }
  std::remove(path.c_str());
}

// A file none of whose tensors fits (another model's weights, another naming) is refused in one line naming
// the file and a name from each side, rather than training from the random initialisation.
TEST(Safetensors, LoadWeightsRefusesAFileOfWhichNothingFits) {
  torch::nn::Linear target(torch::nn::LinearOptions(3, 2));
  const std::string path = temp_path("unrelated.safetensors");
  save_safetensors(path, {{"encoder.proj.weight", torch::zeros({2, 3})}, {"weight", torch::zeros({3, 2})}});
  const torch::Tensor before = target->weight.detach().clone();
  try {
    load_weights(*target, path);
    ADD_FAILURE() << "a file that loads nothing was accepted";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path + ": none of its 2 tensors fits the model"), std::string::npos) << message;
    EXPECT_NE(message.find("'encoder.proj.weight'"), std::string::npos) << message;
    EXPECT_NE(message.find("'bias'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_TRUE(torch::equal(target->weight, before));
  std::remove(path.c_str());
}

TEST(Safetensors, SaveIsAtomicAndLeavesNoTempFile) {
  const std::string path = temp_path("atomic.safetensors");
  save_safetensors(path, {{"a", torch::ones({4})}});
  save_safetensors(path, {{"a", torch::zeros({4})}});  // replaces the old file whole
  EXPECT_TRUE(torch::equal(load_safetensors(path).find("a"), torch::zeros({4})));
  EXPECT_FALSE(std::ifstream(path + ".tmp." + std::to_string(::getpid())).good());
  std::remove(path.c_str());
}

TEST(Safetensors, DamagedFilesFailWithTheFileNameAndTheProblem) {
  const std::string good = temp_path("good.safetensors");
  save_safetensors(good, {{"w", torch::arange(64, torch::kFloat32)}});
  const std::string bytes = read_bytes(good);

  const std::string truncated = temp_path("truncated.safetensors");
  write_bytes(truncated, bytes.substr(0, bytes.size() - 10));
  expect_load_error(truncated, "lies outside the file");
  expect_load_error(truncated, "(the file was cut short)");

  const std::string tiny = temp_path("tiny.safetensors");
  write_bytes(tiny, bytes.substr(0, 5));
  expect_load_error(tiny, "shorter than");

  const std::string huge_header = temp_path("huge_header.safetensors");
  std::string corrupt_length = bytes;
  corrupt_length[5] = '\x7f';
  write_bytes(huge_header, corrupt_length);
  expect_load_error(huge_header, "header length");

  const std::string bad_json = temp_path("bad_json.safetensors");
  std::string broken = bytes;
  broken[8] = '[';  // the JSON's opening brace
  broken[9] = '[';
  write_bytes(bad_json, broken);
  expect_load_error(bad_json, "its header is not valid JSON at byte 3 of");

  // A byte that is no UTF-8 inside a name: the JSON parser's own words ("[json.exception.parse_error.101] ...
  // ill-formed UTF-8 byte") are not what the user reads.
  const std::string not_utf8 = temp_path("not_utf8.safetensors");
  std::string garbled = bytes;
  garbled[10] = '\xff';  // inside the first tensor's name
  write_bytes(not_utf8, garbled);
  expect_load_error(not_utf8, "its header is not valid JSON at byte");
  try {
    load_safetensors(not_utf8);
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(std::string(error.what()).find("json.exception"), std::string::npos) << error.what();
  }

  expect_load_error(temp_path("missing.safetensors"), "cannot open");
  for (const auto& p : {good, truncated, tiny, huge_header, bad_json, not_utf8}) std::remove(p.c_str());
}

// A folder opens for reading as a file does: the reader took it for a file of 2^63 bytes that was cut short.
TEST(Safetensors, AFolderIsRefusedInOneLineNamingIt) {
  const std::string folder = temp_path("folder.safetensors");
  std::filesystem::create_directories(folder);
  expect_load_error(folder, ": is a folder, not a safetensors file");
  try {
    SafetensorsReader reader(folder);
    ADD_FAILURE() << "read the folder " << folder;
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
  }
  std::filesystem::remove(folder);
}

TEST(Safetensors, SaveReportsADirectoryThatCannotBeSynced) {
  const std::string path = temp_path("directory_fsync.safetensors");
  std::string message;
  fail_directory_fsync = true;
  try {
    save_safetensors(path, {{"a", torch::ones({4})}});
  } catch (const Error& error) {
    message = error.what();
  }
  fail_directory_fsync = false;
  EXPECT_NE(message.find("cannot fsync directory"), std::string::npos) << "got '" << message << "'";
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(EIO)), std::string::npos) << message;
  std::remove(path.c_str());
}

// A file with `header` as its JSON and `data_bytes` zero bytes after it, whatever the header claims.
std::string raw_safetensors(const std::string& header, size_t data_bytes) {
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  return length + header + std::string(data_bytes, '\0');
}

// Headers written to make a reader allocate terabytes, overflow its size arithmetic or read outside the file:
// each must be refused with InvalidArgument naming the file, the tensor and the problem, before any allocation.
TEST(Safetensors, CraftedHeadersFailBeforeAnyAllocation) {
  struct Crafted {
    const char* name;
    const char* entry;  // the JSON of tensor "crafted"
    const char* problem;
  };
  const Crafted cases[] = {
      {"terabytes", R"({"dtype":"F32","shape":[1099511627776],"data_offsets":[0,16]})",
       "has 16 bytes but its dtype and shape need 4398046511104"},
      {"overflowing_shape", R"({"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]})",
       "too large"},
      {"overflowing_bytes", R"({"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,16]})", "too large"},
      {"past_the_end", R"({"dtype":"U8","shape":[1024],"data_offsets":[0,1024]})", "outside the file"},
      {"begin_after_end", R"({"dtype":"U8","shape":[0],"data_offsets":[16,8]})", "begins after it ends"},
      {"byte_count", R"({"dtype":"F32","shape":[3],"data_offsets":[0,16]})",
       "has 16 bytes but its dtype and shape need 12"},
      {"negative_dimension", R"({"dtype":"U8","shape":[-16],"data_offsets":[0,16]})", "non-negative integers"},
      {"fractional_dimension", R"({"dtype":"U8","shape":[2.5],"data_offsets":[0,16]})", "non-negative integers"},
      {"negative_offset", R"({"dtype":"U8","shape":[16],"data_offsets":[-16,0]})", "non-negative integers"},
      {"one_offset", R"({"dtype":"U8","shape":[16],"data_offsets":[16]})", "[BEGIN, END]"},
  };
  for (const auto& crafted : cases) {
    SCOPED_TRACE(crafted.name);
    const std::string path = temp_path(std::string(crafted.name) + ".safetensors");
    write_bytes(path, raw_safetensors(std::string(R"({"crafted":)") + crafted.entry + "}", 16));
    expect_load_error(path, "'crafted'");
    expect_load_error(path, crafted.problem);
    std::remove(path.c_str());
  }

  const std::string longer_than_file = temp_path("longer_than_file.safetensors");
  std::string bytes = raw_safetensors(R"({"crafted":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0);
  bytes[0] = static_cast<char>(bytes[0] + 1);  // one byte more header than the file holds
  write_bytes(longer_than_file, bytes);
  expect_load_error(longer_than_file, "header length");
  std::remove(longer_than_file.c_str());
}

}  // namespace
}  // namespace tandem::checkpoint

// The library's fsync calls bind to this definition (a program's own symbols come first in dynamic lookup), so
// a test can make syncing the directory fail deterministically; otherwise it is the plain system call.
extern "C" int fsync(int fd) {
  struct stat info;
  if (tandem::checkpoint::fail_directory_fsync && ::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
    errno = EIO;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_fsync, fd));
}
