// BatchLoader: batches in the sampler's order with padding counts, identical with and without prefetch,
// a bounded prefetch queue, loading errors reaching the consumer, and clean shutdown mid-epoch.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>

#include "support/tensor_values.h"
#include "support/gpu.h"
#include "tandem/data/batch_loader.h"
#include "tandem/data/mnist_dataset.h"
#include "tandem/data/tensor_dataset.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

// Sample i has data [i, -i] (float) and target i, so a batch's content shows which samples it holds.
std::shared_ptr<TensorDataset> numbered_dataset(int64_t n) {
  torch::Tensor ids = torch::arange(n, torch::kLong);
  torch::Tensor data = torch::stack({ids.to(torch::kFloat32), -ids.to(torch::kFloat32)}, 1);
  return std::make_shared<TensorDataset>(data, ids);
}

using testing::to_vector;

BatchSampler make_batches(int64_t n, int64_t world, int64_t rank, int64_t batch_size, uint64_t seed = 0) {
  return BatchSampler(DistributedSampler(n, DistributedSamplerOptions{world, rank, true, seed, false}), batch_size);
}

std::vector<Batch> drain(BatchLoader& loader) {
  std::vector<Batch> batches;
  while (std::optional<Batch> batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

TEST(BatchLoader, BatchesFollowTheSamplerWithPaddingCounts) {
  const int64_t n = 23, world = 3, batch_size = 4;
  auto dataset = numbered_dataset(n);
  for (int64_t prefetch : {0, 1, 3}) {
    std::multiset<int64_t> real_targets;
    for (int64_t rank = 0; rank < world; ++rank) {
      BatchLoader loader(dataset, make_batches(n, world, rank, batch_size, 42), BatchLoaderOptions{prefetch});
      loader.start_epoch(2);
      const std::vector<IndexBatch> expected = loader.sampler().batches();
      const std::vector<Batch> batches = drain(loader);
      ASSERT_EQ(batches.size(), expected.size());
      EXPECT_EQ(static_cast<int64_t>(batches.size()), loader.num_batches());
      for (size_t b = 0; b < batches.size(); ++b) {
        EXPECT_EQ(batches[b].indices, expected[b].indices);
        EXPECT_EQ(to_vector(batches[b].target), expected[b].indices) << "targets in sampler order";
        EXPECT_TRUE(torch::equal(batches[b].data.select(1, 0).to(torch::kLong), batches[b].target));
        EXPECT_EQ(batches[b].padding_count, expected[b].padding_count);
        const std::vector<int64_t> targets = to_vector(batches[b].target);
        real_targets.insert(targets.begin(), targets.begin() + batches[b].real_count());
      }
      EXPECT_FALSE(loader.next().has_value()) << "stays at the end";
    }
    // 23 samples on 3 ranks: 1 padding sample; real rows over all ranks are every sample exactly once.
    EXPECT_EQ(real_targets.size(), static_cast<size_t>(n)) << "prefetch " << prefetch;
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(real_targets.count(i), 1u) << "sample " << i;
  }
}

TEST(BatchLoader, ReproducibleAcrossLoadersAndEpochs) {
  auto dataset = numbered_dataset(50);
  BatchLoader a(dataset, make_batches(50, 2, 1, 8, 7), BatchLoaderOptions{2});
  BatchLoader b(dataset, make_batches(50, 2, 1, 8, 7), BatchLoaderOptions{0});
  a.start_epoch(1);
  b.start_epoch(1);
  const auto from_a = drain(a), from_b = drain(b);
  ASSERT_EQ(from_a.size(), from_b.size());
  for (size_t i = 0; i < from_a.size(); ++i) EXPECT_TRUE(torch::equal(from_a[i].data, from_b[i].data));
  a.start_epoch(2);
  EXPECT_NE(drain(a)[0].indices, from_a[0].indices) << "a new epoch reshuffles";
}

// A data set that records how far ahead of the consumer the loader reads, and can fail on one batch.
class ProbeDataset : public Dataset {
 public:
  explicit ProbeDataset(int64_t n, int64_t fail_on_call = -1) : inner_(numbered_dataset(n)), fail_on_call_(fail_on_call) {}
  int64_t size() const override { return inner_->size(); }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t call = calls_++;
    max_ahead_ = std::max(max_ahead_, call - requested_);
    changed_.notify_all();
    if (call == fail_on_call_) throw InvalidArgument("sample file broken.png: not a PNG image");
    return inner_->get_batch(indices);
  }
  // The test calls this before each next(): the loader may not load batch k before next() was called k - C times.
  void note_request() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++requested_;
  }
  bool wait_for_calls(int64_t count) const {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return calls_ >= count; });
  }
  int64_t max_ahead() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return max_ahead_;
  }
  int64_t calls() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }

 private:
  std::shared_ptr<TensorDataset> inner_;
  int64_t fail_on_call_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  mutable int64_t calls_ = 0;
  mutable int64_t max_ahead_ = 0;
  int64_t requested_ = 0;
};

TEST(BatchLoader, PrefetchRunsAheadButStaysBounded) {
  const int64_t capacity = 2;
  auto probe = std::make_shared<ProbeDataset>(40);
  BatchLoader loader(probe, make_batches(40, 1, 0, 4), BatchLoaderOptions{capacity});
  loader.start_epoch(0);
  // Before anything is consumed the background thread fills the queue and loads one more batch.
  ASSERT_TRUE(probe->wait_for_calls(capacity + 1)) << "prefetch thread did not load ahead";
  int64_t batches = 0;
  while (true) {
    probe->note_request();
    if (!loader.next()) break;
    ++batches;
  }
  EXPECT_EQ(batches, 10);
  // Batch k is loaded only after k - capacity batches were taken: never more than `capacity` ahead.
  EXPECT_EQ(probe->max_ahead(), capacity);
}

// Two batches of 4 on each of 2 ranks are the order's first 16 positions.
TEST(BatchLoader, StartingAtAPositionSkipsTheEarlierBatchesWithoutLoadingThem) {
  const int64_t n = 40, world = 2;
  for (int64_t prefetch : {0, 2}) {
    auto probe = std::make_shared<ProbeDataset>(n);
    BatchLoader whole(probe, make_batches(n, world, 1, 4, 5), BatchLoaderOptions{prefetch});
    whole.start_epoch(3);
    const std::vector<Batch> all = drain(whole);
    ASSERT_EQ(all.size(), 5u);
    ASSERT_TRUE(probe->wait_for_calls(5));

    auto resumed_probe = std::make_shared<ProbeDataset>(n);
    BatchLoader resumed(resumed_probe, make_batches(n, world, 1, 4, 5), BatchLoaderOptions{prefetch});
    resumed.start_epoch(3, 2 * 4 * world);
    const std::vector<Batch> rest = drain(resumed);
    ASSERT_EQ(rest.size(), 3u) << "prefetch " << prefetch;
    for (size_t b = 0; b < rest.size(); ++b) EXPECT_EQ(rest[b].indices, all[b + 2].indices);
    EXPECT_EQ(resumed_probe->calls(), 3) << "the two skipped batches must not be loaded";
  }
}

TEST(BatchLoader, LoadingErrorReachesTheConsumerAndEndsTheEpoch) {
  for (int64_t prefetch : {0, 2}) {
    auto probe = std::make_shared<ProbeDataset>(40, /*fail_on_call=*/3);
    BatchLoader loader(probe, make_batches(40, 1, 0, 4), BatchLoaderOptions{prefetch});
    loader.start_epoch(0);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next().has_value());
    try {
      loader.next();
      ADD_FAILURE() << "expected the data set's exception";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("broken.png"), std::string::npos);
    }
    EXPECT_FALSE(loader.next().has_value());
    loader.start_epoch(1);  // a new epoch starts cleanly after a failure
    EXPECT_EQ(static_cast<int64_t>(drain(loader).size()), 10);
  }
}

TEST(BatchLoader, ShutsDownCleanlyMidEpoch) {
  auto probe = std::make_shared<ProbeDataset>(400);
  {
    BatchLoader loader(probe, make_batches(400, 1, 0, 4), BatchLoaderOptions{2});
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(probe->wait_for_calls(3));
    loader.start_epoch(1);  // abandons epoch 0 with its thread blocked on a full queue
    ASSERT_TRUE(loader.next().has_value());
  }  // destructor stops the blocked thread; a hang here fails the test by CTest's timeout
  SUCCEED();
}

TEST(BatchLoader, RejectsMisuse) {
  auto dataset = numbered_dataset(10);
  BatchLoader loader(dataset, make_batches(10, 1, 0, 4));
  EXPECT_THROW(loader.next(), InvalidArgument);
  EXPECT_THROW(BatchLoader(dataset, make_batches(11, 1, 0, 4)), InvalidArgument);
  EXPECT_THROW(BatchLoader(nullptr, make_batches(10, 1, 0, 4)), InvalidArgument);
  EXPECT_THROW(BatchLoader(dataset, make_batches(10, 1, 0, 4), BatchLoaderOptions{-1}), InvalidArgument);
  EXPECT_THROW(dataset->get_batch({3, 10}), InvalidArgument);
  EXPECT_THROW(TensorDataset(torch::zeros({3, 2}), torch::zeros({4})), InvalidArgument);
}

TEST(BatchLoader, FashionMnistEpochThroughput) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const auto load_start = std::chrono::steady_clock::now();
  auto train = std::make_shared<MnistDataset>(dir, MnistSplit::kTrain, kFashionMnistNormalization);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  BatchLoader loader(train, make_batches(train->size(), 2, 0, 64));
  loader.start_epoch(0);
  const auto start = std::chrono::steady_clock::now();
  int64_t samples = 0;
  while (std::optional<Batch> batch = loader.next()) {
    EXPECT_EQ(batch->data.sizes().vec(), (std::vector<int64_t>{batch->size(), 1, 28, 28}));
    samples += batch->size();
  }
  const double epoch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(samples, 30000);
  std::cout << "Fashion-MNIST: load train split " << load_s << " s; one rank-of-2 epoch (batch 64, "
            << loader.num_batches() << " batches) " << epoch_s << " s = " << samples / epoch_s << " samples/s\n";
}

// With a GPU as the device, every batch arrives on it (through pinned memory) holding the same samples in the
// same order as on the CPU, with and without the prefetch thread.
TEST(BatchLoaderOnGpu, BatchesArriveOnTheGpuWithTheCpuContent) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto dataset = numbered_dataset(50);
  const torch::Device gpu(torch::kCUDA, 0);
  for (int64_t prefetch : {int64_t{0}, int64_t{2}}) {
    BatchLoader on_cpu(dataset, make_batches(50, 2, 1, 8), BatchLoaderOptions{prefetch});
    BatchLoader on_gpu(dataset, make_batches(50, 2, 1, 8), BatchLoaderOptions{prefetch, gpu});
    on_cpu.start_epoch(3);
    on_gpu.start_epoch(3);
    std::vector<Batch> expected = drain(on_cpu), got = drain(on_gpu);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].data.device(), gpu);
      EXPECT_EQ(got[i].target.device(), gpu);
      EXPECT_TRUE(torch::equal(got[i].data.cpu(), expected[i].data)) << "batch " << i;
      EXPECT_EQ(to_vector(got[i].target.cpu()), to_vector(expected[i].target)) << "batch " << i;
      EXPECT_EQ(got[i].padding_count, expected[i].padding_count);
    }
  }
}

}  // namespace
}  // namespace tandem::data
