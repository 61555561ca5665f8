// Every input a fuzzer in fuzz/ found a bug with, fed again to the parser it broke, in the normal build (no
// sanitizers there, so a memory error may pass silently; the fuzz build is where it would show). Each input sits
// in tests/fuzz/regressions/<fuzzer>/ under a name that says what was wrong with it. The contract checked is the
// one the harnesses check: a parser either reads the file or throws InvalidArgument; anything else fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "fuzz/checkpoint_model.h"
#include "fuzz/pickle_reader.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/idx_file.h"
#include "tandem/data/image.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// The committed inputs of one fuzzer, sorted; none if it has found nothing yet.
std::vector<fs::path> regression_inputs(const std::string& fuzzer) {
  std::vector<fs::path> inputs;
  const fs::path dir = fs::path(TANDEM_FUZZ_REGRESSION_DIR) / fuzzer;
  if (!fs::is_directory(dir)) return inputs;
  for (const auto& entry : fs::directory_iterator(dir)) inputs.push_back(entry.path());
  std::sort(inputs.begin(), inputs.end());
  return inputs;
}

void expect_read_or_invalid_argument(const std::string& fuzzer, const std::function<void(const std::string&)>& read) {
  for (const fs::path& input : regression_inputs(fuzzer)) {
    SCOPED_TRACE(input.string());
    try {
      read(input.string());
    } catch (const InvalidArgument&) {
    } catch (const std::exception& error) {
      ADD_FAILURE() << "threw something other than InvalidArgument: " << error.what();
    }
  }
}

TEST(FuzzRegressions, IdxReader) {
  expect_read_or_invalid_argument("idx_reader", [](const std::string& path) { data::read_idx_file(path); });
}

TEST(FuzzRegressions, SafetensorsReader) {
  expect_read_or_invalid_argument("safetensors_reader",
                                  [](const std::string& path) { checkpoint::load_safetensors(path); });
}

TEST(FuzzRegressions, ImageDecoder) {
  expect_read_or_invalid_argument("image_decoder", [](const std::string& path) { data::read_image(path); });
}

TEST(FuzzRegressions, CheckpointReader) {
  expect_read_or_invalid_argument("checkpoint_reader", [](const std::string& path) {
    fuzz::CheckpointModel target;
    checkpoint::load_checkpoint(path, *target.model, target.optimizer);
  });
}

TEST(FuzzRegressions, PickleReader) {
  expect_read_or_invalid_argument("pickle_reader", [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    fuzz::read_pytorch_pickles(std::string(std::istreambuf_iterator<char>(in), {}));
  });
}

}  // namespace
}  // namespace tandem
