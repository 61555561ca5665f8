#include "tandem/ddp/replica_sync.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"
#include "tandem/util/fingerprint.h"

namespace tandem::ddp {
namespace {

std::string describe(const std::string& kind, const std::string& name, const torch::Tensor& tensor) {
  std::ostringstream out;
  out << kind << " '" << name << "' " << tensor.sizes() << " " << tensor.scalar_type();
  if (kind == "parameter") out << (tensor.requires_grad() ? " trainable" : " frozen");
  return out.str();
}

int64_t fingerprint(const std::string& text) { return static_cast<int64_t>(Fingerprint().add(text).value()); }

}  // namespace

void verify_replicas_match(comm::Communicator& communicator, const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                           const torch::OrderedDict<std::string, torch::Tensor>& buffers, const std::string& settings) {
  std::vector<std::string> entries;
  entries.push_back("settings {" + settings + "}");
  for (const auto& item : parameters) entries.push_back(describe("parameter", item.key(), item.value()));
  for (const auto& item : buffers) entries.push_back(describe("buffer", item.key(), item.value()));

  std::string all;
  for (const auto& entry : entries) all += entry + "\n";
  const int world = communicator.world_size();
  auto summaries = comm::all_gather_values(communicator, torch::tensor({static_cast<int64_t>(entries.size()), fingerprint(all)}));
  bool same = true;
  int64_t max_count = 0;
  for (const auto& summary : summaries) {
    same = same && torch::equal(summary, summaries[0]);
    max_count = std::max(max_count, summary[0].item<int64_t>());
  }
  if (same) return;

  // Slow path, taken by every rank alike since all saw the same summaries: find the first differing entry.
  torch::Tensor hashes = torch::zeros({max_count}, torch::kLong);
  for (size_t i = 0; i < entries.size(); ++i) hashes[i] = fingerprint(entries[i]);
  auto all_hashes = comm::all_gather_values(communicator, hashes);
  int64_t first = 0;
  while (first < max_count) {
    bool differs = false;
    for (int r = 1; r < world; ++r) differs = differs || !all_hashes[r][first].equal(all_hashes[0][first]);
    if (differs) break;
    ++first;
  }
  TANDEM_CHECK(first < max_count, "replica fingerprints differ but no entry does");

  const std::string mine = first < static_cast<int64_t>(entries.size()) ? entries[first] : "nothing";
  const std::string detail = comm::describe_rank_groups(comm::all_gather_strings(communicator, mine));
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: the ranks' models differ at entry {}: {}; every rank must build the same model "
      "(and pass the same options) before wrapping it",
      first, detail));
}

void verify_replicas_hold_same_values(comm::Communicator& communicator,
                                      const torch::OrderedDict<std::string, torch::Tensor>& tensors,
                                      const std::string& when, bool participating) {
  // The last slot says whether this rank's fingerprints count.
  const int64_t count = static_cast<int64_t>(tensors.size());
  torch::Tensor fingerprints = torch::zeros({count + 1}, torch::kLong);
  int64_t* out = fingerprints.data_ptr<int64_t>();
  out[count] = participating ? 1 : 0;
  if (participating) {
    for (const auto& item : tensors) {
      const torch::Tensor bytes = item.value().detach().to(torch::kCPU).contiguous();
      *out++ = static_cast<int64_t>(Fingerprint().add(bytes.data_ptr(), bytes.numel() * bytes.element_size()).value());
    }
  }
  const std::vector<torch::Tensor> all = comm::all_gather_values(communicator, fingerprints);
  for (int64_t i = 0; i < count; ++i) {
    // One entry per rank, a rank left out included, so that the message still numbers the ranks.
    std::vector<std::string> per_rank;
    std::vector<std::string> compared;
    for (const auto& rank_fingerprints : all) {
      if (rank_fingerprints[count].item<int64_t>() == 0) {
        per_rank.push_back("no replica (shadowing)");
        continue;
      }
      per_rank.push_back(fmt::format("{:016x}", static_cast<uint64_t>(rank_fingerprints[i].item<int64_t>())));
      compared.push_back(per_rank.back());
    }
    if (std::all_of(compared.begin(), compared.end(), [&](const std::string& f) { return f == compared[0]; })) continue;
    throw ReplicaDivergenceError(fmt::format(
        "DistributedDataParallel: the ranks' replicas differ {}, first in '{}' ({}); stopping every rank. A rank "
        "changed its weights alone, or a gradient all-reduce was skipped; restart from the last checkpoint",
        when, tensors[i].key(), comm::describe_rank_groups(per_rank)));
  }
}

CoalescedBroadcaster::CoalescedBroadcaster(std::vector<torch::Tensor> tensors) {
  std::map<std::pair<int, std::string>, size_t> group_of;
  for (auto& tensor : tensors) {
    if (tensor.numel() == 0) continue;
    auto key = std::make_pair(static_cast<int>(tensor.scalar_type()), tensor.device().str());
    auto [it, inserted] = group_of.emplace(key, groups_.size());
    if (inserted) groups_.emplace_back();
    groups_[it->second].tensors.push_back(tensor);
  }
  for (auto& group : groups_) {
    int64_t numel = 0;
    for (const auto& tensor : group.tensors) numel += tensor.numel();
    group.flat = torch::empty({numel}, group.tensors.front().options().requires_grad(false));
  }
}

void CoalescedBroadcaster::broadcast(comm::Communicator& communicator, int root) {
  torch::NoGradGuard no_grad;
  const bool is_root = communicator.rank() == root;
  std::vector<comm::WorkPtr> works;
  works.reserve(groups_.size());
  for (auto& group : groups_) {
    if (is_root) {
      int64_t offset = 0;
      for (const auto& tensor : group.tensors) {
        group.flat.narrow(0, offset, tensor.numel()).view_as(tensor).copy_(tensor);
        offset += tensor.numel();
      }
    }
    works.push_back(communicator.broadcast(group.flat, root));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    works[g]->wait();
    if (is_root) continue;
    int64_t offset = 0;
    for (auto& tensor : groups_[g].tensors) {
      tensor.copy_(groups_[g].flat.narrow(0, offset, tensor.numel()).view_as(tensor));
      offset += tensor.numel();
    }
  }
}

}  // namespace tandem::ddp
