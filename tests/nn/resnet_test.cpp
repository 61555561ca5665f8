// ResNet-18/34: parameter and buffer names and shapes equal torchvision's (fixture written by
// tests/fixtures/make_resnet_names.py), forward shapes, and ResNet-18 with SyncBatchNorm on 2 ranks with unequal
// batches equals the BatchNorm model on the concatenated batch (what DDP + SyncBatchNorm computes).
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include "support/thread_ranks.h"
#include "tandem/nn/resnet.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

using torch::Tensor;

struct Entry {
  std::string kind, name, shape;
  bool operator==(const Entry& other) const {
    return kind == other.kind && name == other.name && shape == other.shape;
  }
};
std::ostream& operator<<(std::ostream& out, const Entry& e) { return out << e.kind << " " << e.name << " " << e.shape; }

std::string shape_string(const Tensor& t) {
  if (t.dim() == 0) return "scalar";
  std::string s;
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "x" : "") + std::to_string(t.size(d));
  return s;
}

std::vector<Entry> read_fixture(const std::string& file) {
  std::ifstream in(std::string(TANDEM_FIXTURE_DIR) + "/" + file);
  EXPECT_TRUE(in.good()) << "missing fixture " << file;
  std::vector<Entry> entries;
  Entry e;
  while (in >> e.kind >> e.name >> e.shape) entries.push_back(e);
  return entries;
}

std::vector<Entry> model_entries(const torch::nn::Module& model) {
  std::vector<Entry> entries;
  for (const auto& p : model.named_parameters()) entries.push_back({"param", p.key(), shape_string(p.value())});
  for (const auto& b : model.named_buffers()) entries.push_back({"buffer", b.key(), shape_string(b.value())});
  return entries;
}

TEST(ResNet, NamesAndShapesMatchTorchvision) {
  for (const std::string name : {"resnet18", "resnet34"}) {
    const std::vector<Entry> expected = read_fixture(name + "_state_dict.txt");
    ASSERT_FALSE(expected.empty());
    const std::vector<Entry> actual = model_entries(*nn::make_resnet(name, 1000));
    ASSERT_EQ(actual.size(), expected.size()) << name;
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << name << " entry " << i;
  }
  int64_t count = 0;
  for (const auto& p : nn::resnet18(1000)->parameters()) count += p.numel();
  EXPECT_EQ(count, 11689512);  // torchvision's published ResNet-18 size
}

TEST(ResNet, ConvertedNamesStayTheSame) {
  nn::ResNet model = nn::resnet18(10);
  const auto before = model_entries(*model);
  nn::convert_sync_batchnorm(model.ptr());
  EXPECT_EQ(nn::count_sync_batchnorm(*model), 20);
  EXPECT_EQ(model_entries(*model), before);
}

TEST(ResNet, ForwardShapes) {
  torch::NoGradGuard no_grad;
  nn::ResNet model = nn::resnet18(7);
  model->eval();
  EXPECT_EQ(model(torch::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(model(torch::randn({1, 3, 64, 48})).sizes(), (std::vector<int64_t>{1, 7}));
  EXPECT_EQ(nn::resnet34(3)(torch::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_THROW(model(torch::randn({2, 1, 32, 32})), InvalidArgument);
  EXPECT_THROW(nn::make_resnet("resnet50", 10), InvalidArgument);
}

// dp::DataParallel copies its model with clone(): the copy must hold every tensor under the same name with the
// same value, in storage of its own, and compute what the model computes, downsample shortcuts included.
TEST(ResNet, CloneIsAnEqualCopyWithStorageOfItsOwn) {
  torch::NoGradGuard no_grad;
  nn::ResNet model = nn::resnet18(10);
  // Not the fresh running statistics (num_batches_tracked, an integer, stays 0).
  for (auto& buffer : model->buffers()) {
    if (buffer.is_floating_point()) buffer.uniform_(0.5, 1.5);
  }
  model->eval();
  nn::ResNet copy(std::dynamic_pointer_cast<nn::ResNetImpl>(model->clone()));
  EXPECT_EQ(model_entries(*copy), model_entries(*model));
  auto copied = copy->named_parameters();
  for (const auto& buffer : copy->named_buffers()) copied.insert(buffer.key(), buffer.value());
  auto originals = model->named_parameters();
  for (const auto& buffer : model->named_buffers()) originals.insert(buffer.key(), buffer.value());
  for (const auto& original : originals) {
    EXPECT_TRUE(copied[original.key()].equal(original.value())) << original.key();
    EXPECT_NE(copied[original.key()].data_ptr(), original.value().data_ptr()) << original.key();
  }
  const Tensor x = torch::randn({2, 3, 32, 32});
  EXPECT_TRUE(copy(x).equal(model(x)));
}

void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto params = to.named_parameters(), buffers = to.named_buffers();
  for (const auto& p : from.named_parameters()) params[p.key()].copy_(p.value());
  for (const auto& b : from.named_buffers()) buffers[b.key()].copy_(b.value());
}

TEST(ResNet, SyncBatchNormOnTwoRanksEqualsBatchNormOnWholeBatch) {
  const int64_t classes = 3;
  const std::vector<int64_t> batch_sizes{2, 3};
  torch::manual_seed(11);
  const Tensor images = torch::randn({5, 3, 32, 32});
  const Tensor labels = torch::tensor({0, 2, 1, 1, 0}, torch::kLong);

  nn::ResNet reference = nn::resnet18(classes);
  nn::ResNet initial = nn::resnet18(classes);
  copy_state(*reference, *initial);
  // Sum of per-sample losses: each rank differentiates its own share, and the ranks' gradients sum to this.
  torch::nn::functional::cross_entropy(reference(images), labels,
                                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
      .backward();

  std::mutex mutex;
  double worst_grad = 0, worst_buffer = 0;
  std::string worst_name;
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    nn::ResNet model = nn::resnet18(classes);
    copy_state(*initial, *model);
    nn::convert_sync_batchnorm(model.ptr(), comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    const int64_t begin = rank == 0 ? 0 : batch_sizes[0];
    const int64_t end = begin + batch_sizes[rank];
    torch::nn::functional::cross_entropy(model(images.slice(0, begin, end)), labels.slice(0, begin, end),
                                         torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
        .backward();
    const auto expected = reference->named_parameters();
    double local_worst = 0;
    std::string local_name;
    for (const auto& p : model->named_parameters()) {
      Tensor grad = p.value().grad().clone();
      communicator.all_reduce(grad, comm::ReduceOp::Sum)->wait();
      const Tensor& want = expected[p.key()].grad();
      // Relative to the gradient's scale: deep-network gradients vary over orders of magnitude.
      const double diff = ((grad - want).abs().max() / (want.abs().max() + 1e-3)).item<double>();
      if (diff > local_worst) local_worst = diff, local_name = p.key();
    }
    const auto expected_buffers = reference->named_buffers();
    double local_buffer = 0;
    for (const auto& b : model->named_buffers()) {
      local_buffer = std::max(local_buffer, (b.value().to(torch::kDouble) - expected_buffers[b.key()].to(torch::kDouble))
                                                .abs()
                                                .max()
                                                .item<double>());
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (local_worst > worst_grad) worst_grad = local_worst, worst_name = local_name;
    worst_buffer = std::max(worst_buffer, local_buffer);
  });
  std::cout << "[ largest difference ] relative gradient " << worst_grad << " (" << worst_name
            << "), running stats " << worst_buffer << "\n";
  EXPECT_LT(worst_grad, 1e-4);
  EXPECT_LT(worst_buffer, 1e-5);
}

}  // namespace
}  // namespace tandem
