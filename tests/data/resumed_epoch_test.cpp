// An epoch stopped on N ranks x b after k batches and continued on M ranks x b' from the global position
// P = min(k * b * N, n) (issue 31): every rank of both layouts simulated in one process, for several sizes, with
// and without padding, a cut tail (the sampler's drop_last or the batches'), uneven shares and accumulated
// batches. Together the two layouts train every sample of the epoch once (none twice, as a real sample), the
// first layout trained exactly the order's positions [0, P), and with the same global batch (N * b == M * b')
// global batch j of the continuation holds the samples the uninterrupted epoch's batch k + j holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tandem/data/batch_sampler.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/util/error.h"

// A namespace of its own: the tests of a folder are compiled as one unit.
namespace tandem::data::resumed_epoch {
namespace {

constexpr uint64_t kSeed = 11;
constexpr int64_t kEpoch = 4;

// How an epoch is shared out, as the training loop sets it up (train/training_loaders.cpp).
struct Layout {
  int64_t world;
  int64_t batch;
  bool sampler_drop_last = false;  // the sampler cuts the tail to a multiple of the world size
  bool batch_drop_last = false;    // each rank drops its partial last batch
  bool uneven = false;
};

std::string describe(int64_t n, const Layout& a, const Layout& b, int64_t k) {
  return "n=" + std::to_string(n) + " " + std::to_string(a.world) + "x" + std::to_string(a.batch) + " -> " +
         std::to_string(b.world) + "x" + std::to_string(b.batch) + " after " + std::to_string(k) + " batches" +
         (a.sampler_drop_last ? " sampler-drop-last" : "") + (a.batch_drop_last ? " batch-drop-last" : "") +
         (a.uneven ? " uneven" : "");
}

// Every rank's batches of the epoch from `first_position` on, rank by rank.
std::vector<std::vector<IndexBatch>> batches_of(int64_t n, const Layout& layout, int64_t first_position,
                                                SingleSampleTail tail) {
  std::vector<std::vector<IndexBatch>> ranks;
  for (int64_t rank = 0; rank < layout.world; ++rank) {
    DistributedSamplerOptions options{layout.world, rank, true, kSeed, layout.sampler_drop_last, layout.uneven};
    BatchSampler sampler(DistributedSampler(n, options), layout.batch, layout.batch_drop_last, tail);
    sampler.set_epoch(kEpoch, first_position);
    ranks.push_back(sampler.batches());
  }
  return ranks;
}

// The epoch's order: position p holds sample order[p].
std::vector<int64_t> order_of(int64_t n) {
  DistributedSampler whole(n, DistributedSamplerOptions{1, 0, true, kSeed, false});
  whole.set_epoch(kEpoch);
  return whole.global_indices();
}

void add_real(const IndexBatch& batch, std::map<int64_t, int>& seen) {
  for (int64_t i = 0; i < batch.real_count(); ++i) ++seen[batch.indices[static_cast<size_t>(i)]];
}

// The samples of global batch j (batch j of every rank), real ones only.
std::multiset<int64_t> global_batch(const std::vector<std::vector<IndexBatch>>& ranks, size_t j) {
  std::multiset<int64_t> samples;
  for (const auto& rank : ranks) {
    if (j < rank.size()) samples.insert(rank[j].indices.begin(), rank[j].indices.begin() + rank[j].real_count());
  }
  return samples;
}

// Stops `first` after k batches of rank 0 and continues on `second`; checks the whole epoch.
void check_continuation(int64_t n, const Layout& first, const Layout& second, int64_t k) {
  SCOPED_TRACE(describe(n, first, second, k));
  const std::vector<int64_t> order = order_of(n);
  // The stopped run: kKeep, as no run stops inside an uneven epoch's merged tail (uneven runs checkpoint only
  // at an epoch's end); the continuation cuts its batches as training does.
  const auto before = batches_of(n, first, 0, SingleSampleTail::kKeep);
  const int64_t position = std::min(k * first.batch * first.world, n);
  std::map<int64_t, int> seen;
  for (const auto& rank : before) {
    for (size_t j = 0; j < rank.size() && static_cast<int64_t>(j) < k; ++j) add_real(rank[j], seen);
  }
  std::set<int64_t> trained_first;
  for (const auto& [sample, times] : seen) trained_first.insert(sample);
  EXPECT_EQ(trained_first, std::set<int64_t>(order.begin(), order.begin() + position))
      << "the first k batches of every rank are the order's positions [0, P)";

  const SingleSampleTail tail = second.uneven ? SingleSampleTail::kMergeIntoPrevious : SingleSampleTail::kKeep;
  const auto after = batches_of(n, second, position, tail);
  for (const auto& rank : after) {
    for (const IndexBatch& batch : rank) add_real(batch, seen);
    if (!second.uneven) {
      EXPECT_EQ(rank.size(), after[0].size()) << "every rank has rank 0's number of batches";
    }
  }
  int64_t dropped = 0;
  for (int64_t sample = 0; sample < n; ++sample) {
    const int times = seen.count(sample) ? seen[sample] : 0;
    EXPECT_LE(times, 1) << "sample " << sample << " trained twice";
    dropped += times == 0 ? 1 : 0;
  }
  if (!second.sampler_drop_last && !second.batch_drop_last) {
    EXPECT_EQ(dropped, 0) << "every sample of the epoch is trained once";
  } else {
    // Only the tail is cut: less than a batch per rank, and the sampler's remainder of fewer than M samples.
    EXPECT_LT(dropped, second.world * (second.batch + 1));
    for (int64_t p = 0; p < n - dropped; ++p) EXPECT_EQ(seen.count(order[static_cast<size_t>(p)]), 1u) << p;
  }

  if (first.world * first.batch == second.world * second.batch && !first.uneven && !second.uneven) {
    // A cut tail depends on the world size, so under drop_last the last global batch may differ.
    const bool cut = second.sampler_drop_last || second.batch_drop_last;
    const size_t compared = after[0].size() - (cut && !after[0].empty() ? 1 : 0);
    for (size_t j = 0; j < compared; ++j) {
      EXPECT_EQ(global_batch(after, j), global_batch(before, static_cast<size_t>(k) + j))
          << "global batch " << j << " of the continuation";
    }
  }
  if (first.world == second.world && first.batch == second.batch && !first.uneven && !second.uneven) {
    for (size_t r = 0; r < after.size(); ++r) {
      ASSERT_EQ(after[r].size() + static_cast<size_t>(k), before[r].size());
      for (size_t j = 0; j < after[r].size(); ++j) {
        EXPECT_EQ(after[r][j].indices, before[r][j + static_cast<size_t>(k)].indices) << "rank " << r << " batch " << j;
        EXPECT_EQ(after[r][j].padding_count, before[r][j + static_cast<size_t>(k)].padding_count);
      }
    }
  }
}

// k: a stop inside the epoch after whole steps of `accumulate` batches, as checkpoints are taken.
std::vector<int64_t> stops_inside(int64_t n, const Layout& layout, int64_t accumulate) {
  const int64_t batches = static_cast<int64_t>(batches_of(n, layout, 0, SingleSampleTail::kKeep)[0].size());
  std::vector<int64_t> stops;
  for (int64_t k = accumulate; k < batches; k += accumulate) stops.push_back(k);
  return stops;
}

TEST(ResumedEpoch, TwoLayoutsTogetherTrainEverySampleOnce) {
  int64_t checked = 0;
  for (int64_t n : {37, 96, 100, 129}) {
    for (int64_t n_world : {1, 2, 3, 4}) {
      for (int64_t m_world : {1, 2, 3, 5}) {
        for (const auto& [b, b2] : {std::pair<int64_t, int64_t>{4, 4}, {4, 8}, {7, 3}, {8, 2}}) {
          for (int mode = 0; mode < 4; ++mode) {
            Layout first{n_world, b}, second{m_world, b2};
            for (Layout* layout : {&first, &second}) {
              layout->sampler_drop_last = mode == 1;
              layout->batch_drop_last = mode == 2;
              layout->uneven = mode == 3;
            }
            for (int64_t accumulate : {1, 3}) {
              for (int64_t k : stops_inside(n, first, accumulate)) {
                check_continuation(n, first, second, k);
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// A padded run continued without padding and back: the positions count the same, whatever the layouts' options.
TEST(ResumedEpoch, ContinuesAcrossPaddedAndUnevenLayouts) {
  for (int64_t n : {50, 101}) {
    Layout padded{3, 4}, uneven{2, 5};
    uneven.uneven = true;
    for (int64_t k : stops_inside(n, padded, 1)) check_continuation(n, padded, uneven, k);
    for (int64_t k : stops_inside(n, uneven, 1)) check_continuation(n, uneven, padded, k);
  }
}

TEST(ResumedEpoch, AnEpochStartingAtTheEndHoldsNothingAndOneBeyondItIsRefused) {
  DistributedSampler sampler(10, DistributedSamplerOptions{3, 1, true, kSeed, false});
  sampler.set_epoch(2, 10);
  EXPECT_EQ(sampler.num_samples(), 0);
  EXPECT_TRUE(sampler.indices().empty());
  EXPECT_THROW(sampler.set_epoch(2, 11), InvalidArgument);
  EXPECT_THROW(sampler.set_epoch(2, -1), InvalidArgument);
  sampler.set_epoch(3);
  EXPECT_EQ(sampler.first_position(), 0) << "the next epoch starts at its beginning again";
  EXPECT_EQ(sampler.num_samples(), 4);
}

// 3 samples left for 5 ranks: padding repeats the order from its start, as PyTorch pads, and says so.
TEST(ResumedEpoch, FewerSamplesLeftThanRanksArePaddedFromTheOrdersStart) {
  const std::vector<int64_t> order = order_of(20);
  std::vector<int64_t> real, padding;
  for (int64_t rank = 0; rank < 5; ++rank) {
    DistributedSampler sampler(20, DistributedSamplerOptions{5, rank, true, kSeed, false});
    sampler.set_epoch(kEpoch, 17);
    ASSERT_EQ(sampler.num_samples(), 1);
    (sampler.is_padding(0) ? padding : real).push_back(sampler.indices()[0]);
  }
  EXPECT_EQ(real, std::vector<int64_t>(order.begin() + 17, order.end()));
  EXPECT_EQ(padding, std::vector<int64_t>(order.begin(), order.begin() + 2));
}

}  // namespace
}  // namespace tandem::data::resumed_epoch
