// Writes the fuzzers' seed corpora: small valid files made by tandem's own writers (and zlib's and stb's), so
// the seeds stay in step with the formats and nothing binary has to live in the repository.
//   tandem_fuzz_seeds OUT_DIR   ->  OUT_DIR/<fuzzer>/<seed files>, <fuzzer> without the _fuzzer suffix
#include <stb/stb_image_write.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/checkpoint_model.h"
#include "src/checkpoint/dcp_metadata.h"
#include "src/checkpoint/pickle.h"
#include "src/checkpoint/torch_archive.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/image.h"
#include "tandem/util/error.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

Bytes idx_bytes(const std::vector<uint32_t>& dims) {
  Bytes out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  size_t count = 1;
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(d >> shift));
    count *= d;
  }
  for (size_t i = 0; i < count; ++i) out.push_back(static_cast<uint8_t>(i * 37));
  return out;
}

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw tandem::Error("cannot write " + path.string());
}

void write_gzip_file(const fs::path& path, const Bytes& bytes) {
  gzFile out = gzopen(path.c_str(), "wb9");
  if (!out || gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size()) ||
      gzclose(out) != Z_OK) {
    throw tandem::Error("cannot write " + path.string());
  }
}

void write_idx_seeds(const fs::path& dir) {
  write_file(dir / "images.idx", idx_bytes({2, 3, 3}));
  write_file(dir / "labels.idx", idx_bytes({5}));
  write_gzip_file(dir / "images.idx.gz", idx_bytes({2, 3, 3}));
}

void write_safetensors_seeds(const fs::path& dir) {
  tandem::checkpoint::save_safetensors(
      (dir / "weights.safetensors").string(),
      {{"conv.weight", torch::arange(6, torch::kFloat32).reshape({2, 3})},
       {"conv.bias", torch::ones({2}, torch::kFloat16)},
       {"steps", torch::tensor({7}, torch::kInt64)},
       {"mask", torch::tensor({true, false})},
       {"empty", torch::zeros({0, 4}, torch::kUInt8)}},
      {{"format", "pt"}});
}

void write_image_seeds(const fs::path& dir) {
  std::vector<uint8_t> pixels(4 * 4 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 16);
  tandem::data::write_png((dir / "rgb.png").string(), pixels.data(), 4, 4, 3);
  tandem::data::write_png((dir / "gray.png").string(), pixels.data(), 4, 4, 1);
  tandem::data::write_png((dir / "rgba.png").string(), pixels.data(), 4, 4, 4);
  if (!stbi_write_jpg((dir / "rgb.jpg").c_str(), 4, 4, 3, pixels.data(), 90)) {
    throw tandem::Error("cannot write " + (dir / "rgb.jpg").string());
  }
  for (const auto& entry : fs::directory_iterator(TANDEM_JPEG_FIXTURE_DIR)) {
    if (entry.path().extension() == ".jpg") fs::copy_file(entry.path(), dir / entry.path().filename());
  }
}

// A checkpoint of the fuzzer's own model after one step, so it carries momentum buffers.
void write_checkpoint_seeds(const fs::path& dir) {
  tandem::fuzz::CheckpointModel target;
  target.model->forward(torch::ones({1, 3})).sum().backward();
  target.optimizer.step();
  tandem::checkpoint::CheckpointState state;
  state.epoch = 1;
  state.batches_done = 2;
  state.step = 3;
  state.lr = state.base_lr = 0.1;
  state.lrf = 0.01;
  state.epochs = 4;
  state.sampler_seed = 5;
  tandem::checkpoint::save_checkpoint((dir / "checkpoint.safetensors").string(), *target.model, target.optimizer,
                                      state);
}

// A distributed checkpoint's metadata and its items, as tandem writes them for PyTorch.
void write_pickle_seeds(const fs::path& dir) {
  tandem::checkpoint::DcpMetadata metadata;
  metadata.tensors["model.fc.weight"] = {torch::kFloat32, {4, 3}, {{{0, 0}, {2, 3}}, {{2, 0}, {2, 3}}}};
  metadata.storage[{"model.fc.weight", {0, 0}}] = {"__0_0.distcp", 0, 1600};
  metadata.storage[{"model.fc.weight", {2, 0}}] = {"__1_0.distcp", 0, 1600};
  metadata.byte_entries.push_back("optimizer.param_groups.0.lr");
  metadata.storage[{"optimizer.param_groups.0.lr", {}}] = {"__0_0.distcp", 1600, 900};
  metadata.paths["model.fc.weight"] = {{"model"}, {"fc.weight"}};
  std::ofstream(dir / "metadata", std::ios::binary) << tandem::checkpoint::write_dcp_metadata(metadata);
  std::ofstream tensor_archive(dir / "tensor_archive", std::ios::binary);
  const auto to = [](std::ofstream& out) { return [&out](std::string_view bytes) { out << bytes; }; };
  tandem::checkpoint::write_torch_archive_of_tensor(torch::arange(12, torch::kFloat32).view({3, 4}).t(),
                                                    to(tensor_archive));
  tandem::checkpoint::PickleWriter value;
  value.real(0.9);
  value.real(0.999);
  value.tuple(2);
  std::ofstream value_archive(dir / "value_archive", std::ios::binary);
  tandem::checkpoint::write_torch_archive_of_value(value.finish(), to(value_archive));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const std::pair<const char*, void (*)(const fs::path&)> seeds[] = {
      {"idx_reader", write_idx_seeds},
      {"safetensors_reader", write_safetensors_seeds},
      {"image_decoder", write_image_seeds},
      {"checkpoint_reader", write_checkpoint_seeds},
      {"pickle_reader", write_pickle_seeds},
  };
  try {
    for (const auto& [name, write] : seeds) {
      fs::create_directories(out / name);
      write(out / name);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tandem_fuzz_seeds: %s\n", error.what());
    return 1;
  }
  return 0;
}
