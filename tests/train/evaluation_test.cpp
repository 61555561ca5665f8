// Distributed evaluation (train/evaluation.h) on ranks as threads: each test sample counts once, never the
// sampler's padding, also when a rank's batch lost unreadable images; and every rank runs the forward on every
// batch, even one that is all padding or all unreadable, as FSDP's gathers need.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "support/thread_ranks.h"
#include "tandem/data/batch_loader.h"
#include "tandem/data/batch_sampler.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/data/tensor_dataset.h"
#include "tandem/train/evaluation.h"

namespace tandem::train {
namespace {

// `count` blank images labelled 0, 1, 0, 1, ... and a "model" that always predicts class 0: exactly the even
// samples are right, so a count is easy to work out by hand.
std::shared_ptr<data::TensorDataset> alternating_labels(int64_t count) {
  return std::make_shared<data::TensorDataset>(torch::zeros({count, 1, 28, 28}),
                                               torch::arange(count, torch::kInt64).remainder(2));
}

torch::Tensor always_zero(const torch::Tensor& x) {
  torch::Tensor logits = torch::zeros({x.size(0), 10});
  logits.select(1, 0).fill_(1.0);
  return logits;
}

TEST(Evaluate, CountsEachTestSampleOnceWhenTheWorldDoesNotDivideTheTestSet) {
  // 10 samples over 3 ranks: the sampler pads to 12 by repeating samples 0 and 1. Labels alternate 0/1 and
  // the "model" always predicts class 0, so the exact answer is 5 of 10; counting padding would give 6 of 12.
  auto dataset = alternating_labels(10);
  testing::run_thread_ranks(3, [&](int rank, comm::Communicator& communicator) {
    data::DistributedSamplerOptions sampling{3, rank, /*shuffle=*/false, 0, false};
    data::BatchLoader loader(dataset, data::BatchSampler(data::DistributedSampler(10, sampling), 3));
    EvalCounts counts = evaluate(always_zero, loader, 0, &communicator);
    EXPECT_EQ(counts.total, 10) << "rank " << rank;
    EXPECT_EQ(counts.correct, 5) << "rank " << rank;
  });
}

// evaluate() with always_zero on each of `world` ranks' unshuffled share of `dataset` in batches of `batch_size`;
// checks on every rank that the forward ran `forwards` times and the counts.
void expect_forwards_and_counts(const std::shared_ptr<data::Dataset>& dataset, int world, int64_t batch_size,
                                int forwards, int64_t total, int64_t correct) {
  testing::run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
    data::DistributedSamplerOptions sampling{world, rank, /*shuffle=*/false, 0, false};
    data::BatchLoader loader(dataset,
                             data::BatchSampler(data::DistributedSampler(dataset->size(), sampling), batch_size));
    int calls = 0;
    const auto counting = [&calls](const torch::Tensor& x) {
      ++calls;
      return always_zero(x);
    };
    EvalCounts counts = evaluate(counting, loader, 0, &communicator);
    EXPECT_EQ(calls, forwards) << "rank " << rank;
    EXPECT_EQ(counts.total, total) << "rank " << rank;
    EXPECT_EQ(counts.correct, correct) << "rank " << rank;
  });
}

TEST(Evaluate, RunsTheForwardOnEveryBatchEvenOneThatIsAllPadding) {
  // 201 samples over 2 ranks in batches of 100: rank 1's second batch holds only the padding sample.
  expect_forwards_and_counts(alternating_labels(201), 2, 100, /*forwards=*/2, /*total=*/201, /*correct=*/101);
}

// A data set whose image `bad` cannot be read: get_batch drops its rows, as ImageFolderDataset does under
// --skip-bad-images.
class DroppingDataset : public data::Dataset {
 public:
  DroppingDataset(std::shared_ptr<data::TensorDataset> inner, int64_t bad) : inner_(std::move(inner)), bad_(bad) {}
  int64_t size() const override { return inner_->size(); }
  data::Batch get_batch(const std::vector<int64_t>& indices) const override {
    std::vector<int64_t> kept;
    for (int64_t index : indices) {
      if (index != bad_) kept.push_back(index);
    }
    return inner_->get_batch(kept);
  }

 private:
  std::shared_ptr<data::TensorDataset> inner_;
  int64_t bad_;
};

TEST(Evaluate, CountsEachReadableSampleOnceWhenADroppedImageWasAlsoPadding) {
  // 10 samples on 3 ranks without shuffling: rank 1 gets 1, 4, 7 and padding 0; rank 0 gets 0, 3, 6, 9. Sample
  // 0 is unreadable, so rank 0's batch loses a real row and rank 1's its padding row: the 9 readable samples
  // count once each (labels alternate, the model predicts 0: samples 2, 4, 6, 8 are right).
  auto dataset = std::make_shared<DroppingDataset>(alternating_labels(10), 0);
  testing::run_thread_ranks(3, [&](int rank, comm::Communicator& communicator) {
    data::DistributedSamplerOptions sampling{3, rank, /*shuffle=*/false, 0, false};
    data::BatchLoader loader(dataset, data::BatchSampler(data::DistributedSampler(10, sampling), 4));
    EvalCounts counts = evaluate(always_zero, loader, 0, &communicator);
    EXPECT_EQ(counts.total, 9) << "rank " << rank;
    EXPECT_EQ(counts.correct, 4) << "rank " << rank;
  });
}

TEST(Evaluate, RunsTheForwardOnABatchWhoseImagesWereAllUnreadable) {
  // 4 samples on 2 ranks in batches of 1, unshuffled: rank 0 gets 0 then 2, rank 1 gets 1 then 3. Sample 2 cannot
  // be read, so rank 0's second batch is empty; it still runs its forward, as FSDP's gathers need, and counts none.
  expect_forwards_and_counts(std::make_shared<DroppingDataset>(alternating_labels(4), 2), 2, 1, /*forwards=*/2,
                             /*total=*/3, /*correct=*/1);
}

}  // namespace
}  // namespace tandem::train
