#include "tandem/comm/value_collectives.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace tandem::comm {
namespace {

// `values` on the backend's device; the same tensor when it is there already, so no copy back is needed.
torch::Tensor staged(const Communicator& communicator, const torch::Tensor& values) {
  return values.device() == communicator.device() ? values : values.to(communicator.device());
}

}  // namespace

void all_reduce_values(Communicator& communicator, torch::Tensor& values, ReduceOp op) {
  torch::Tensor on_backend = staged(communicator, values);
  communicator.all_reduce(on_backend, op)->wait();
  if (!on_backend.is_same(values)) values.copy_(on_backend);
}

void broadcast_values(Communicator& communicator, torch::Tensor& values, int root) {
  torch::Tensor on_backend = staged(communicator, values);
  communicator.broadcast(on_backend, root)->wait();
  if (!on_backend.is_same(values)) values.copy_(on_backend);
}

std::vector<torch::Tensor> all_gather_values(Communicator& communicator, const torch::Tensor& values) {
  torch::Tensor input = staged(communicator, values);
  std::vector<torch::Tensor> outputs(communicator.world_size());
  for (auto& out : outputs) out = torch::empty_like(input);
  communicator.all_gather(outputs, input)->wait();
  for (auto& out : outputs) out = out.cpu();
  return outputs;
}

std::string broadcast_string(Communicator& communicator, const std::string& value, int root) {
  if (communicator.world_size() < 2) return value;
  torch::Tensor length = torch::tensor({static_cast<int64_t>(value.size())});
  broadcast_values(communicator, length, root);
  torch::Tensor bytes = torch::zeros({length.item<int64_t>()}, torch::kUInt8);
  if (communicator.rank() == root && !value.empty()) std::memcpy(bytes.data_ptr(), value.data(), value.size());
  if (bytes.numel() > 0) broadcast_values(communicator, bytes, root);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

std::vector<std::string> all_gather_strings(Communicator& communicator, const std::string& value, size_t max_bytes) {
  if (communicator.world_size() < 2) return {value.substr(0, max_bytes)};
  const size_t length = std::min(value.size(), max_bytes);
  // One length byte-count per rank in front of a fixed-size field, so that one all-gather carries all.
  torch::Tensor field = torch::zeros({static_cast<int64_t>(sizeof(int64_t) + max_bytes)}, torch::kUInt8);
  const int64_t length64 = static_cast<int64_t>(length);
  std::memcpy(field.data_ptr(), &length64, sizeof(length64));
  std::memcpy(static_cast<char*>(field.data_ptr()) + sizeof(int64_t), value.data(), length);
  std::vector<std::string> values;
  for (const torch::Tensor& gathered : all_gather_values(communicator, field)) {
    int64_t gathered_length = 0;
    std::memcpy(&gathered_length, gathered.data_ptr(), sizeof(gathered_length));
    values.emplace_back(static_cast<const char*>(gathered.data_ptr()) + sizeof(int64_t),
                        static_cast<size_t>(gathered_length));
  }
  return values;
}

std::string describe_rank_groups(const std::vector<std::string>& value_per_rank) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(value_per_rank.size()); ++r) {
    auto found = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == value_per_rank[r]; });
    if (found == groups.end()) {
      groups.push_back({value_per_rank[r], {r}});
    } else {
      found->second.push_back(r);
    }
  }
  std::string text;
  for (const auto& [value, ranks] : groups) {
    text += fmt::format("{}ranks [{}] have {}", text.empty() ? "" : "; ", fmt::join(ranks, ", "), value);
  }
  return text;
}

}  // namespace tandem::comm
