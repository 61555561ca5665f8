// DistributedSampler and BatchSampler: index-for-index equality with PyTorch (fixture made once by
// tests/fixtures/make_sampler_fixture.py), and the properties training and evaluation rely on, checked by
// simulating every rank's sampler in one process.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "support/json_fixture.h"
#include "tandem/data/batch_sampler.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

DistributedSampler sampler_from(const nlohmann::json& c) {
  DistributedSamplerOptions options;
  options.num_replicas = c.at("world").get<int64_t>();
  options.rank = c.at("rank").get<int64_t>();
  options.shuffle = c.at("shuffle").get<bool>();
  options.drop_last = c.at("drop_last").get<bool>();
  options.seed = c.at("seed").get<uint64_t>();
  DistributedSampler sampler(c.at("n").get<int64_t>(), options);
  sampler.set_epoch(c.at("epoch").get<int64_t>());
  return sampler;
}

std::string describe(const nlohmann::json& c) {
  return "n=" + c.at("n").dump() + " world=" + c.at("world").dump() + " rank=" + c.at("rank").dump() +
         " shuffle=" + c.at("shuffle").dump() + " drop_last=" + c.at("drop_last").dump() +
         " seed=" + c.at("seed").dump() + " epoch=" + c.at("epoch").dump();
}

TEST(DistributedSampler, MatchesPyTorchIndexForIndex) {
  const nlohmann::json fixture = testing::load_json_fixture("sampler_pytorch.json");
  const auto& cases = fixture.at("cases");
  ASSERT_GT(cases.size(), 600u);
  int64_t mismatches = 0;
  for (const auto& c : cases) {
    const DistributedSampler sampler = sampler_from(c);
    const auto expected = c.at("indices").get<std::vector<int64_t>>();
    EXPECT_EQ(sampler.num_samples(), c.at("num_samples").get<int64_t>()) << describe(c);
    EXPECT_EQ(sampler.total_size(), c.at("total_size").get<int64_t>()) << describe(c);
    if (sampler.indices() != expected) {
      ++mismatches;
      ADD_FAILURE() << "indices differ from PyTorch " << fixture.at("torch_version") << " for " << describe(c);
    }
  }
  std::cout << "compared " << cases.size() << " sampler configurations with PyTorch "
            << fixture.at("torch_version").get<std::string>() << ": " << mismatches << " mismatches\n";
}

TEST(DistributedSampler, MatchesPyTorchOnDatasetSizedPermutations) {
  const nlohmann::json fixture = testing::load_json_fixture("sampler_pytorch.json");
  for (const auto& c : fixture.at("large")) {
    const std::vector<int64_t> indices = sampler_from(c).indices();
    ASSERT_EQ(static_cast<int64_t>(indices.size()), c.at("num_samples").get<int64_t>()) << describe(c);
    const auto head = c.at("head").get<std::vector<int64_t>>();
    EXPECT_TRUE(std::equal(head.begin(), head.end(), indices.begin())) << describe(c);
    int64_t weighted_sum = 0;
    for (size_t j = 0; j < indices.size(); ++j) weighted_sum += static_cast<int64_t>(j) * indices[j];
    EXPECT_EQ(weighted_sum, c.at("weighted_sum").get<int64_t>()) << describe(c);
  }
}

TEST(BatchSampler, MatchesPyTorchBatchSampler) {
  const nlohmann::json fixture = testing::load_json_fixture("sampler_pytorch.json");
  for (const auto& c : fixture.at("batches")) {
    BatchSampler batch_sampler(sampler_from(c), c.at("batch_size").get<int64_t>(),
                               c.at("drop_last_batches").get<bool>());
    const auto expected = c.at("batches").get<std::vector<std::vector<int64_t>>>();
    const std::vector<IndexBatch> batches = batch_sampler.batches();
    ASSERT_EQ(batches.size(), expected.size()) << describe(c);
    EXPECT_EQ(batch_sampler.num_batches(), static_cast<int64_t>(expected.size()));
    for (size_t b = 0; b < batches.size(); ++b) EXPECT_EQ(batches[b].indices, expected[b]) << describe(c) << " batch " << b;
  }
}

// All ranks of one configuration, simulated in one process.
std::vector<DistributedSampler> all_ranks(int64_t n, int64_t world, bool shuffle, bool drop_last, uint64_t seed,
                                          int64_t epoch) {
  std::vector<DistributedSampler> samplers;
  for (int64_t rank = 0; rank < world; ++rank) {
    samplers.emplace_back(n, DistributedSamplerOptions{world, rank, shuffle, seed, drop_last});
    samplers.back().set_epoch(epoch);
  }
  return samplers;
}

TEST(DistributedSampler, RanksCoverEveryIndexExactlyOnceAndPadAtTheEnd) {
  for (int64_t n : {0, 1, 5, 10, 11, 17, 100, 1001}) {
    for (int64_t world : {1, 2, 3, 4, 7}) {
      for (bool shuffle : {false, true}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " world=" + std::to_string(world) + " shuffle=" + std::to_string(shuffle));
        std::map<int64_t, int64_t> real_seen;  // index -> times it appeared as a real (non-padding) sample
        int64_t padding = 0;
        int64_t num_samples = -1;
        for (const DistributedSampler& sampler : all_ranks(n, world, shuffle, false, 7, 2)) {
          const std::vector<int64_t> indices = sampler.indices();
          ASSERT_EQ(static_cast<int64_t>(indices.size()), sampler.num_samples());
          if (num_samples >= 0) {
            EXPECT_EQ(sampler.num_samples(), num_samples) << "ranks differ in length";
          }
          num_samples = sampler.num_samples();
          for (int64_t j = 0; j < sampler.num_samples(); ++j) {
            ASSERT_GE(indices[j], 0);
            ASSERT_LT(indices[j], n);
            if (sampler.is_padding(j)) {
              ++padding;
              EXPECT_GE(j, sampler.real_count()) << "padding must be a suffix";
            } else {
              ++real_seen[indices[j]];
            }
          }
        }
        EXPECT_EQ(static_cast<int64_t>(real_seen.size()), n) << "every index is some rank's real sample";
        for (const auto& [index, times] : real_seen) EXPECT_EQ(times, 1) << "index " << index;
        const int64_t expected_padding = (world - n % world) % world;
        EXPECT_EQ(padding, n == 0 ? 0 : expected_padding);
        EXPECT_EQ(num_samples * world, n + padding);
      }
    }
  }
}

TEST(DistributedSampler, UnevenTakesEverySampleOnceWithoutPadding) {
  for (int64_t n : {0, 1, 5, 11, 100}) {
    for (int64_t world : {1, 3, 7}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " world=" + std::to_string(world));
      std::map<int64_t, int64_t> seen;
      for (int64_t rank = 0; rank < world; ++rank) {
        DistributedSampler sampler(n, DistributedSamplerOptions{world, rank, true, 7, false, /*uneven=*/true});
        sampler.set_epoch(1);
        const std::vector<int64_t> indices = sampler.indices();
        EXPECT_EQ(static_cast<int64_t>(indices.size()), n / world + (rank < n % world ? 1 : 0));
        EXPECT_EQ(sampler.num_samples(), static_cast<int64_t>(indices.size()));
        EXPECT_EQ(sampler.padding_count(), 0);
        for (int64_t index : indices) ++seen[index];
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
      for (const auto& [index, times] : seen) EXPECT_EQ(times, 1) << "index " << index;
    }
  }
  EXPECT_THROW(DistributedSampler(10, DistributedSamplerOptions{2, 0, false, 0, true, true}), InvalidArgument);
}

TEST(DistributedSampler, PaddingLongerThanDatasetRepeatsCyclically) {
  // n=2 on 7 ranks: the padded list is p0 p1 p0 p1 p0 p1 p0 (PyTorch's second padding branch).
  const auto samplers = all_ranks(2, 7, false, false, 0, 0);
  std::vector<int64_t> flat;
  int64_t padding = 0;
  for (const auto& s : samplers) {
    ASSERT_EQ(s.num_samples(), 1);
    flat.push_back(s.indices()[0]);
    padding += s.padding_count();
  }
  EXPECT_EQ(flat, (std::vector<int64_t>{0, 1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(padding, 5);
}

TEST(DistributedSampler, DropLastCutsTheTailAndHasNoPadding) {
  for (int64_t n : {10, 11, 17, 100}) {
    for (int64_t world : {2, 3, 4}) {
      std::set<int64_t> seen;
      int64_t total = 0;
      for (const DistributedSampler& s : all_ranks(n, world, true, true, 42, 1)) {
        EXPECT_EQ(s.num_samples(), n / world);
        EXPECT_EQ(s.padding_count(), 0);
        for (int64_t index : s.indices()) seen.insert(index);
        total += s.num_samples();
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), total) << "no index twice with drop_last";
      EXPECT_EQ(total, n - n % world);
    }
  }
}

TEST(DistributedSampler, EpochChangesOrderAndSameEpochRepeatsIt) {
  DistributedSampler sampler(100, DistributedSamplerOptions{2, 1, true, 0, false});
  const std::vector<int64_t> epoch0 = sampler.indices();
  sampler.set_epoch(1);
  const std::vector<int64_t> epoch1 = sampler.indices();
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(sampler.indices(), epoch1) << "same epoch, same order";
  sampler.set_epoch(0);
  EXPECT_EQ(sampler.indices(), epoch0);

  DistributedSampler other_seed(100, DistributedSamplerOptions{2, 1, true, 1, false});
  EXPECT_NE(other_seed.indices(), epoch0);

  DistributedSampler in_order(10, DistributedSamplerOptions{3, 1, false, 0, false});
  in_order.set_epoch(5);
  EXPECT_EQ(in_order.indices(), (std::vector<int64_t>{1, 4, 7, 0}));  // rank r takes r, r+W, ...; then padding
  EXPECT_EQ(in_order.real_count(), 3);
  EXPECT_TRUE(in_order.is_padding(3));
}

TEST(DistributedSampler, RejectsBadConfiguration) {
  EXPECT_THROW(DistributedSampler(10, DistributedSamplerOptions{0, 0}), InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, DistributedSamplerOptions{2, 2}), InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, DistributedSamplerOptions{2, -1}), InvalidArgument);
  EXPECT_THROW(DistributedSampler(-1, DistributedSamplerOptions{}), InvalidArgument);
  EXPECT_THROW(BatchSampler(DistributedSampler(10, {}), 0), InvalidArgument);
}

TEST(BatchSampler, BatchesFollowSamplerOrderAndCountPadding) {
  // n=10, 3 ranks: 4 samples each; rank 1 holds positions 1,4,7 (real) and 10 (padding).
  DistributedSampler sampler(10, DistributedSamplerOptions{3, 1, true, 42, false});
  sampler.set_epoch(3);
  const std::vector<int64_t> order = sampler.indices();

  BatchSampler keep(sampler, 3, false);
  const auto batches = keep.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].indices, std::vector<int64_t>(order.begin(), order.begin() + 3));
  EXPECT_EQ(batches[0].padding_count, 0);
  EXPECT_EQ(batches[1].indices, std::vector<int64_t>(order.begin() + 3, order.end()));
  EXPECT_EQ(batches[1].padding_count, 1);
  EXPECT_EQ(batches[1].real_count(), 0);

  BatchSampler drop(sampler, 3, true);
  EXPECT_EQ(drop.num_batches(), 1);
  ASSERT_EQ(drop.batches().size(), 1u);

  // Across ranks and batches, real counts add up to the data-set size: evaluation counts each sample once.
  for (int64_t n : {10, 11, 17, 100}) {
    for (int64_t world : {1, 2, 3, 4}) {
      int64_t real = 0;
      for (const auto& s : all_ranks(n, world, true, false, 0, 0)) {
        for (const IndexBatch& b : BatchSampler(s, 4).batches()) real += b.real_count();
      }
      EXPECT_EQ(real, n) << "n=" << n << " world=" << world;
    }
  }
}

TEST(BatchSampler, MergedSingleSampleTailKeepsEverySampleAndLeavesNoBatchOfOne) {
  // 50 samples over 3 uneven ranks: 17, 17 and 16; batch 8 leaves a tail of one on ranks 0 and 1.
  for (int64_t rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    DistributedSampler sampler(50, DistributedSamplerOptions{3, rank, true, 5, false, /*uneven=*/true});
    const BatchSampler merged(sampler, 8, false, SingleSampleTail::kMergeIntoPrevious);
    const std::vector<IndexBatch> batches = merged.batches();
    ASSERT_EQ(static_cast<int64_t>(batches.size()), merged.num_batches());
    std::vector<int64_t> joined;
    for (const IndexBatch& batch : batches) {
      EXPECT_GT(batch.size(), 1);
      joined.insert(joined.end(), batch.indices.begin(), batch.indices.end());
    }
    EXPECT_EQ(joined, sampler.indices()) << "every sample once, in the sampler's order";
    EXPECT_EQ(batches.size(), 2u);
    EXPECT_EQ(batches.back().size(), rank < 2 ? 9 : 8);
  }
  // Without a tail of one, or with drop_last, nothing changes.
  DistributedSampler even(48, DistributedSamplerOptions{3, 0, true, 5, false, true});
  EXPECT_EQ(BatchSampler(even, 8, false, SingleSampleTail::kMergeIntoPrevious).batches().back().size(), 8);
  DistributedSampler odd(17, DistributedSamplerOptions{1, 0, true, 5, false, true});
  EXPECT_EQ(BatchSampler(odd, 8, true, SingleSampleTail::kMergeIntoPrevious).num_batches(), 2);
  EXPECT_EQ(BatchSampler(odd, 8, true, SingleSampleTail::kMergeIntoPrevious).batches().back().size(), 8);
  EXPECT_EQ(BatchSampler(odd, 8).batches().back().size(), 1) << "kKeep is PyTorch's BatchSampler";
}

TEST(BatchSampler, SetEpochReachesTheSampler) {
  BatchSampler batches(DistributedSampler(50, DistributedSamplerOptions{2, 0, true, 3, false}), 8);
  const auto first = batches.batches();
  batches.set_epoch(1);
  EXPECT_EQ(batches.epoch(), 1);
  EXPECT_NE(batches.batches()[0].indices, first[0].indices);
}

}  // namespace
}  // namespace tandem::data
