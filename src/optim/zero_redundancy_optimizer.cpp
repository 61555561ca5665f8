#include "tandem/optim/zero_redundancy_optimizer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "tandem/comm/rank_agreement.h"
#include "tandem/comm/value_collectives.h"
#include "tandem/optim/optimizer_archive.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::optim {
namespace {

std::vector<torch::Tensor> flatten_groups(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::vector<torch::Tensor> parameters;
  for (const auto& group : groups) parameters.insert(parameters.end(), group.params().begin(), group.params().end());
  return parameters;
}

// `groups` with only the parameters that `rank` owns under `owner` (indexed group by group), options kept.
std::vector<torch::optim::OptimizerParamGroup> owned_groups(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                                            const std::vector<int>& owner, int rank) {
  std::vector<torch::optim::OptimizerParamGroup> owned;
  size_t index = 0;
  for (const auto& group : groups) {
    std::vector<torch::Tensor> parameters;
    for (const auto& parameter : group.params()) {
      if (owner[index++] == rank) parameters.push_back(parameter);
    }
    owned.emplace_back(std::move(parameters), group.has_options() ? group.options().clone() : nullptr);
  }
  return owned;
}

std::unique_ptr<torch::optim::Optimizer> make_checked(const OptimizerFactory& make_optimizer,
                                                      std::vector<torch::optim::OptimizerParamGroup> groups) {
  const size_t expected = groups.size();
  std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(std::move(groups));
  if (!optimizer || optimizer->param_groups().size() != expected) {
    throw InvalidArgument(fmt::format("ZeroRedundancyOptimizer: the optimizer factory must return an optimizer over "
                                      "the {} param groups it is given, in order",
                                      expected));
  }
  return optimizer;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                                 OptimizerFactory make_optimizer, comm::CommunicatorPtr communicator)
    // The defaults are the local optimizer's, known only once it exists; a placeholder until then.
    : Optimizer(std::vector<torch::optim::OptimizerParamGroup>{}, std::make_unique<torch::optim::OptimizerOptions>()),
      communicator_(std::move(communicator)),
      rank_(communicator_ ? communicator_->rank() : 0),
      world_(communicator_ ? communicator_->world_size() : 1),
      make_optimizer_(std::move(make_optimizer)) {
  if (!make_optimizer_) throw InvalidArgument("ZeroRedundancyOptimizer needs an optimizer factory");
  partition_ = partition_parameters(flatten_groups(param_groups), world_);
  local_ = make_checked(make_optimizer_, owned_groups(param_groups, partition_.owner, rank_));
  // Every group gets the options it resolves to in the local optimizer, so that param_groups() reads (and
  // saves) like a plain optimizer's.
  defaults_ = local_->defaults().clone();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    add_param_group(torch::optim::OptimizerParamGroup(param_groups[g].params(),
                                                      local_->param_groups()[g].options().clone()));
  }

  size_t index = 0;
  for (const torch::Tensor& parameter : all_parameters()) {
    const int owner = partition_.owner[index++];
    auto fits = [&](const Bucket& bucket) {
      const torch::Tensor& first = bucket.parameters.front();
      return bucket.owner == owner && first.scalar_type() == parameter.scalar_type() &&
             first.device() == parameter.device();
    };
    auto bucket = std::find_if(buckets_.begin(), buckets_.end(), fits);
    if (bucket == buckets_.end()) bucket = buckets_.insert(buckets_.end(), Bucket{owner, {}, 0});
    bucket->parameters.push_back(parameter);
    bucket->numel += parameter.numel();
  }
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<torch::Tensor> parameters, OptimizerFactory make_optimizer,
                                                 comm::CommunicatorPtr communicator)
    : ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                                  std::move(parameters))},
                              std::move(make_optimizer), std::move(communicator)) {}

std::vector<torch::Tensor> ZeroRedundancyOptimizer::all_parameters() const { return flatten_groups(param_groups_); }

std::vector<torch::optim::OptimizerParamGroup> ZeroRedundancyOptimizer::groups_owned_by(int rank) const {
  return owned_groups(param_groups_, partition_.owner, rank);
}

torch::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  if (param_groups_.size() != local_->param_groups().size() || all_parameters().size() != partition_.owner.size()) {
    throw InvalidArgument("ZeroRedundancyOptimizer: its param groups changed after construction; the partition of "
                          "the parameters among the ranks is fixed then, so make a new optimizer instead");
  }
  consolidated_.reset();
  auto& local_groups = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) local_groups[g].set_options(param_groups_[g].options().clone());
  torch::Tensor loss = local_->step(std::move(closure));
  broadcast_parameters();
  return loss;
}

// Every bucket's broadcast is started before any is waited for, so the backend can overlap them.
void ZeroRedundancyOptimizer::broadcast_parameters() {
  if (world_ == 1) return;
  torch::NoGradGuard no_grad;
  const torch::Device device = communicator_->device();
  std::vector<torch::Tensor> flats;
  std::vector<comm::WorkPtr> works;
  for (const Bucket& bucket : buckets_) {
    torch::Tensor flat;
    if (bucket.owner == rank_) {
      std::vector<torch::Tensor> pieces;
      for (const auto& parameter : bucket.parameters) pieces.push_back(parameter.reshape({-1}));
      flat = torch::cat(pieces).to(device);
    } else {
      flat = torch::empty({bucket.numel}, bucket.parameters.front().options().device(device));
    }
    works.push_back(communicator_->broadcast(flat, bucket.owner));
    flats.push_back(std::move(flat));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    works[b]->wait();
    if (buckets_[b].owner == rank_) continue;
    int64_t offset = 0;
    for (auto& parameter : buckets_[b].parameters) {
      parameter.copy_(flats[b].narrow(0, offset, parameter.numel()).view_as(parameter));
      offset += parameter.numel();
    }
  }
}

void ZeroRedundancyOptimizer::move_state(torch::optim::Optimizer& from, torch::optim::Optimizer& to, int rank) const {
  size_t index = 0;
  for (const torch::Tensor& parameter : all_parameters()) {
    if (partition_.owner[index++] != rank) continue;
    const auto key = compat::optimizer_state_key(parameter);
    auto found = from.state().find(key);
    if (found != from.state().end()) to.state()[key] = std::move(found->second);
  }
}

// Non-root ranks receive the other ranks' archives too and drop them: the communicator has no gather, and a
// broadcast per rank keeps what a rank holds at a time to one rank's share. A root that fails to load one share
// still takes part in the remaining broadcasts, and the ranks agree on the outcome at the end: every rank then
// fails at once, instead of the others waiting in a broadcast the root never joins until the timeout.
void ZeroRedundancyOptimizer::consolidate_state_dict(int root) {
  if (root < 0 || root >= world_) {
    throw InvalidArgument(fmt::format("consolidate_state_dict: root {} is not a rank of a world of {}", root, world_));
  }
  consolidated_.reset();
  const std::vector<torch::Tensor> parameters = all_parameters();
  const torch::Device device = parameters.empty() ? torch::Device(torch::kCPU) : parameters.front().device();
  std::unique_ptr<torch::optim::Optimizer> full;
  std::exception_ptr failure;
  auto on_root = [&](int sender, const std::function<void()>& action) {
    if (failure) return;
    try {
      action();
    } catch (const std::exception& error) {
      failure = std::make_exception_ptr(Error(fmt::format(
          "consolidate_state_dict on rank {}: could not gather rank {}'s optimizer state: {}", rank_, sender,
          error.what())));
    }
  };
  if (rank_ == root) {
    on_root(root, [&] {
      full = make_checked(make_optimizer_, param_groups_);
      size_t index = 0;
      for (const torch::Tensor& parameter : parameters) {
        if (partition_.owner[index++] != root) continue;
        const auto key = compat::optimizer_state_key(parameter);
        auto found = local_->state().find(key);
        if (found != local_->state().end()) full->state()[key] = found->second->clone();
      }
    });
  }
  for (int sender = 0; sender < world_; ++sender) {
    if (sender == root) continue;
    torch::Tensor archive = rank_ == sender ? save_optimizer_archive(*local_) : torch::Tensor();
    torch::Tensor size = torch::full({1}, archive.defined() ? archive.numel() : 0, torch::kInt64);
    comm::broadcast_values(*communicator_, size, sender);
    if (rank_ != sender) archive = torch::empty({size.item<int64_t>()}, torch::kUInt8);
    comm::broadcast_values(*communicator_, archive, sender);
    if (rank_ != root) continue;
    on_root(sender, [&] {
      std::unique_ptr<torch::optim::Optimizer> share = make_checked(make_optimizer_, groups_owned_by(sender));
      load_optimizer_archive(*share, archive, device);
      move_state(*share, *full, sender);
    });
  }
  comm::agree_or_throw(failure, communicator_.get(), "to consolidate the optimizer state");
  consolidated_ = std::move(full);
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  if (!consolidated_) {
    throw InvalidArgument(fmt::format("ZeroRedundancyOptimizer::save on rank {}: call consolidate_state_dict() on "
                                      "every rank after the last step(), then save on its root only",
                                      rank_));
  }
  consolidated_->save(archive);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  std::unique_ptr<torch::optim::Optimizer> full = make_checked(make_optimizer_, param_groups_);
  full->load(archive);
  local_->state().clear();
  move_state(*full, *local_, rank_);
  consolidated_.reset();
}

}  // namespace tandem::optim
