// TorchDatasetAdapter: tandem's BatchLoader reads a LibTorch data set (plain, and with its batches stacked by
// .map(Stack<>())) into exactly the batches it reads from the equivalent TensorDataset, and refuses a data
// set without a size.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "tandem/data/batch_loader.h"
#include "tandem/data/tensor_dataset.h"
#include "tandem/data/torch_dataset_adapter.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

// Sample i: data 10*i + [[0, 1, 2], [3, 4, 5]] (float), target 3*i + 1, so data and target rows can each be
// traced back to their sample and a row from the wrong sample shows.
torch::Tensor sample_data(int64_t i) {
  return torch::arange(6, torch::kFloat32).view({2, 3}) + 10.0F * static_cast<float>(i);
}
int64_t sample_target(int64_t i) { return 3 * i + 1; }

class TracedTorchDataset : public torch::data::datasets::Dataset<TracedTorchDataset> {
 public:
  explicit TracedTorchDataset(int64_t size) : size_(size) {}
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<int64_t>(index);
    return {sample_data(i), torch::tensor(sample_target(i))};
  }
  compat::TorchDataOptional<size_t> size() const override { return static_cast<size_t>(size_); }

 private:
  int64_t size_;
};

// A data set that, like a stream, cannot say how many samples it holds.
class UnsizedTorchDataset : public torch::data::datasets::Dataset<UnsizedTorchDataset> {
 public:
  torch::data::Example<> get(size_t index) override { return {sample_data(static_cast<int64_t>(index)), {}}; }
  compat::TorchDataOptional<size_t> size() const override { return {}; }
};

std::shared_ptr<TensorDataset> equivalent_tensor_dataset(int64_t n) {
  std::vector<torch::Tensor> data;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    data.push_back(sample_data(i));
    targets.push_back(sample_target(i));
  }
  return std::make_shared<TensorDataset>(torch::stack(data), torch::tensor(targets));
}

std::vector<Batch> load_epoch(std::shared_ptr<const Dataset> dataset, int64_t world, int64_t rank, int64_t epoch) {
  const int64_t batch_size = 4;
  BatchLoader loader(std::move(dataset),
                     BatchSampler(DistributedSampler(23, DistributedSamplerOptions{world, rank, true, 17, false}),
                                  batch_size));
  loader.start_epoch(epoch);
  std::vector<Batch> batches;
  while (std::optional<Batch> batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

TEST(TorchDatasetAdapter, BatchLoaderYieldsTheTensorDatasetsBatches) {
  const int64_t n = 23, world = 3;
  const auto reference = equivalent_tensor_dataset(n);
  const std::shared_ptr<const Dataset> plain = make_dataset(TracedTorchDataset(n));
  const std::shared_ptr<const Dataset> stacked =
      make_dataset(TracedTorchDataset(n).map(torch::data::transforms::Stack<>()));
  EXPECT_EQ(plain->size(), n);
  EXPECT_EQ(stacked->size(), n);
  for (const auto& [name, adapted] : {std::pair{"plain", plain}, std::pair{"stacked", stacked}}) {
    for (int64_t rank = 0; rank < world; ++rank) {
      const std::vector<Batch> expected = load_epoch(reference, world, rank, 1);
      const std::vector<Batch> actual = load_epoch(adapted, world, rank, 1);
      ASSERT_EQ(actual.size(), expected.size()) << name;
      for (size_t b = 0; b < expected.size(); ++b) {
        const std::string where = std::string(name) + " rank " + std::to_string(rank) + " batch " + std::to_string(b);
        EXPECT_EQ(actual[b].indices, expected[b].indices) << where;
        EXPECT_EQ(actual[b].padding_count, expected[b].padding_count) << where;
        EXPECT_EQ(actual[b].data.sizes(), expected[b].data.sizes()) << where;
        EXPECT_EQ(actual[b].target.sizes(), expected[b].target.sizes()) << where;
        EXPECT_EQ(actual[b].target.scalar_type(), expected[b].target.scalar_type()) << where;
        EXPECT_TRUE(torch::equal(actual[b].data, expected[b].data))
            << where << ": largest difference " << (actual[b].data - expected[b].data).abs().max().item<float>();
        EXPECT_TRUE(torch::equal(actual[b].target, expected[b].target)) << where;
      }
    }
  }
}

TEST(TorchDatasetAdapter, RejectsAnIndexOutsideTheDataSet) {
  const auto dataset = make_dataset(TracedTorchDataset(5));
  EXPECT_EQ(dataset->get_batch({4, 0}).indices, (std::vector<int64_t>{4, 0}));
  EXPECT_THROW(dataset->get_batch({0, 5}), InvalidArgument);
  EXPECT_THROW(dataset->get_batch({-1}), InvalidArgument);
}

TEST(TorchDatasetAdapter, ADataSetWithoutASizeIsAnInvalidArgument) {
  try {
    make_dataset(UnsizedTorchDataset());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("does not know its size"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tandem::data
