// TorchDistributedSampler inside LibTorch's own loader (torch::data::make_data_loader): ranks simulated in one
// process hand out tandem's DistributedSampler order, cover every sample once per epoch apart from the padding,
// follow set_epoch through the copy the caller kept, and resume from a saved position.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <sstream>
#include <string>

#include "support/tensor_values.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/data/torch_distributed_sampler.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

// Sample i has data [i, -i] and target i, so a batch's targets say which samples it holds.
class NumberedTorchDataset : public torch::data::datasets::Dataset<NumberedTorchDataset> {
 public:
  explicit NumberedTorchDataset(size_t size) : size_(size) {}
  torch::data::Example<> get(size_t index) override {
    const float value = static_cast<float>(index);
    return {torch::tensor({value, -value}), torch::tensor(static_cast<int64_t>(index))};
  }
  compat::TorchDataOptional<size_t> size() const override { return size_; }

 private:
  size_t size_;
};

using testing::to_vector;

TEST(TorchDistributedSampler, RanksInTorchLoaderCoverEverySampleOncePlusPaddingInTandemOrder) {
  const int64_t world = 2;
  const uint64_t seed = 5;
  for (int64_t n : {10, 11}) {
    for (size_t batch_size : {3, 4}) {
      const std::string name = "n=" + std::to_string(n) + " batch=" + std::to_string(batch_size);
      std::vector<TorchDistributedSampler> samplers;
      std::vector<std::unique_ptr<torch::data::StatelessDataLoader<
          torch::data::datasets::MapDataset<NumberedTorchDataset, torch::data::transforms::Stack<>>,
          TorchDistributedSampler>>>
          loaders;
      for (int64_t rank = 0; rank < world; ++rank) {
        // The loader gets a copy; set_epoch below goes through the copy kept here.
        samplers.emplace_back(DistributedSampler(n, DistributedSamplerOptions{world, rank, true, seed, false}));
        loaders.push_back(torch::data::make_data_loader(
            NumberedTorchDataset(static_cast<size_t>(n)).map(torch::data::transforms::Stack<>()),
            samplers.back(), torch::data::DataLoaderOptions().batch_size(batch_size)));
      }
      std::vector<std::vector<int64_t>> order_of_epoch_0;
      for (int64_t epoch : {0, 1}) {
        std::map<int64_t, int64_t> real_seen, padding_seen;  // sample -> how often
        std::vector<std::vector<int64_t>> orders;
        for (int64_t rank = 0; rank < world; ++rank) {
          samplers[rank].set_epoch(epoch);
          DistributedSampler expected(n, DistributedSamplerOptions{world, rank, true, seed, false});
          expected.set_epoch(epoch);
          std::vector<int64_t> order;
          std::vector<size_t> batch_sizes;
          for (torch::data::Example<>& batch : *loaders[rank]) {
            const std::vector<int64_t> targets = to_vector(batch.target);
            ASSERT_EQ(batch.data.size(0), static_cast<int64_t>(targets.size()));
            EXPECT_TRUE(torch::equal(batch.data.select(1, 0).to(torch::kLong), batch.target)) << name;
            batch_sizes.push_back(targets.size());
            order.insert(order.end(), targets.begin(), targets.end());
          }
          EXPECT_EQ(order, expected.indices()) << name << " rank " << rank << " epoch " << epoch;
          // Every batch full but the last, which holds the rest of the rank's num_samples().
          ASSERT_FALSE(batch_sizes.empty());
          for (size_t b = 0; b + 1 < batch_sizes.size(); ++b) EXPECT_EQ(batch_sizes[b], batch_size) << name;
          EXPECT_EQ(batch_sizes.back(), (expected.num_samples() - 1) % batch_size + 1) << name;
          for (size_t position = 0; position < order.size(); ++position) {
            ++(expected.is_padding(static_cast<int64_t>(position)) ? padding_seen : real_seen)[order[position]];
          }
          orders.push_back(order);
        }
        // Without the padding every sample comes exactly once; the padding (11 samples on 2 ranks: one, at
        // the end of rank 1; 10: none) repeats samples, so that both ranks take as many steps.
        EXPECT_EQ(real_seen.size(), static_cast<size_t>(n)) << name << " epoch " << epoch;
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(real_seen[i], 1) << name << " sample " << i;
        int64_t padding_total = 0;
        for (const auto& [sample, count] : padding_seen) {
          EXPECT_TRUE(sample >= 0 && sample < n) << name;
          padding_total += count;
        }
        EXPECT_EQ(padding_total, n % world == 0 ? 0 : world - n % world) << name;
        if (epoch == 0) {
          order_of_epoch_0 = orders;
        } else {
          EXPECT_NE(orders, order_of_epoch_0) << name << ": set_epoch(1) must change the order";
        }
      }
    }
  }
}

TEST(TorchDistributedSampler, NextHandsOutTheOrderInBatchesThenNothing) {
  DistributedSampler expected(11, DistributedSamplerOptions{2, 1, true, 3, false});
  TorchDistributedSampler sampler(expected);
  std::vector<int64_t> handed_out;
  while (auto batch = sampler.next(4)) {
    EXPECT_LE(batch->size(), 4u);
    handed_out.insert(handed_out.end(), batch->begin(), batch->end());
  }
  EXPECT_EQ(handed_out, expected.indices());
  EXPECT_FALSE(sampler.next(4).has_value()) << "stays used up until reset()";
  sampler.reset();
  ASSERT_TRUE(sampler.next(100).has_value()) << "reset() restarts the epoch";
  EXPECT_THROW(sampler.next(0), InvalidArgument);
}

TEST(TorchDistributedSampler, ResetWithANewSizeReSplitsThatSize) {
  TorchDistributedSampler sampler(DistributedSampler(11, DistributedSamplerOptions{2, 0, true, 3, false}));
  sampler.set_epoch(4);
  sampler.reset(compat::TorchDataOptional<size_t>(20));
  DistributedSampler expected(20, DistributedSamplerOptions{2, 0, true, 3, false});
  expected.set_epoch(4);
  const auto batch = sampler.next(100);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(std::vector<int64_t>(batch->begin(), batch->end()), expected.indices());
  EXPECT_EQ(sampler.sampler().dataset_size(), 20);
}

// The sampler's state through LibTorch's archive, as a checkpoint would carry it.
std::string saved_state(const TorchDistributedSampler& sampler) {
  torch::serialize::OutputArchive archive;
  sampler.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

void load_state(TorchDistributedSampler& sampler, const std::string& state) {
  std::istringstream bytes(state);
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  sampler.load(archive);
}

TEST(TorchDistributedSampler, SaveAndLoadResumeAtTheSameEpochAndPosition) {
  const DistributedSamplerOptions options{2, 0, true, 9, false};
  TorchDistributedSampler saved(DistributedSampler(23, options));
  saved.set_epoch(3);
  ASSERT_TRUE(saved.next(5).has_value());
  const std::string state = saved_state(saved);
  TorchDistributedSampler restored(DistributedSampler(23, options));
  load_state(restored, state);
  EXPECT_EQ(restored.epoch(), 3);
  EXPECT_EQ(restored.position(), 5);
  const auto rest = restored.next(100), expected_rest = saved.next(100);
  ASSERT_TRUE(rest.has_value() && expected_rest.has_value());
  EXPECT_EQ(*rest, *expected_rest) << "the rest of epoch 3's order";

  // A position past this rank's order (a state saved for a larger data set) is refused.
  TorchDistributedSampler smaller(DistributedSampler(6, options));
  EXPECT_THROW(load_state(smaller, state), InvalidArgument);
}

// Resuming through LibTorch's loader: the loader's begin() resets its sampler, and set_epoch of the same epoch
// comes first in a training loop; neither may drop the loaded position.
TEST(TorchDistributedSampler, LoadedPositionSurvivesSetEpochAndTheLoadersResetOnce) {
  const DistributedSamplerOptions options{2, 1, true, 9, false};
  const auto batches_of = [](TorchDistributedSampler& sampler) {
    auto loader = torch::data::make_data_loader(NumberedTorchDataset(23).map(torch::data::transforms::Stack<>()),
                                                sampler, torch::data::DataLoaderOptions().batch_size(3));
    std::vector<std::vector<int64_t>> batches;
    for (auto& batch : *loader) batches.push_back(to_vector(batch.target));
    return batches;
  };
  TorchDistributedSampler original(DistributedSampler(23, options));
  original.set_epoch(3);
  const auto whole_epoch = batches_of(original);
  ASSERT_EQ(whole_epoch.size(), 4u) << "12 samples for rank 1 of 2, in batches of 3";

  original.set_epoch(3);
  ASSERT_TRUE(original.next(3).has_value() && original.next(3).has_value());  // 2 batches trained
  TorchDistributedSampler restored(DistributedSampler(23, options));
  load_state(restored, saved_state(original));
  restored.set_epoch(3);  // what a training loop does before each epoch
  const auto rest = batches_of(restored);
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(whole_epoch.begin() + 2, whole_epoch.end()));
  EXPECT_EQ(batches_of(restored), whole_epoch) << "the next iteration starts the epoch over";
  restored.set_epoch(4);
  EXPECT_EQ(restored.position(), 0);
}

}  // namespace
}  // namespace tandem::data
