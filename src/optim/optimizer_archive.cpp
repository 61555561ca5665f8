#include "tandem/optim/optimizer_archive.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstring>
#include <string>

namespace tandem::optim {

torch::Tensor save_optimizer_archive(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::Tensor tensor = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  return tensor;
}

void load_optimizer_archive(torch::optim::Optimizer& optimizer, const torch::Tensor& bytes, torch::Device device) {
  const torch::Tensor host = bytes.contiguous().cpu();
  torch::serialize::InputArchive archive;
  archive.load_from(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(host.numel()), device);
  optimizer.load(archive);
}

}  // namespace tandem::optim
