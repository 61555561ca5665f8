// The seeds' linear toy (seed 002) as a user writes it with tandem: their own LibTorch data set
// (torch::data::datasets::Dataset) and module, a binary loss, sharded across the ranks by tandem's loader.
//
//   tandem run --nproc-per-node 2 -- ./linear_toy
#include <tandem/comm/process_group.h>
#include <tandem/data/torch_dataset_adapter.h>
#include <tandem/train/loop.h>
#include <torch/torch.h>

#include <cstdio>
#include <utility>

// The seed's SimpleDataset: samples and targets held in memory.
class SimpleDataset : public torch::data::datasets::Dataset<SimpleDataset> {
 public:
  SimpleDataset(torch::Tensor data, torch::Tensor target) : data_(std::move(data)), target_(std::move(target)) {}
  torch::data::Example<> get(size_t index) override { return {data_[index], target_[index]}; }
  torch::optional<size_t> size() const override { return static_cast<size_t>(data_.size(0)); }

 private:
  torch::Tensor data_, target_;
};

// The seed's SimpleModel, returning the logit: the loss below applies the sigmoid inside, which stays exact where
// sigmoid followed by BCELoss rounds to 0 or 1 and loses the gradient.
struct SimpleModelImpl : torch::nn::Module {
  explicit SimpleModelImpl(int64_t input_dim) : fc(register_module("fc", torch::nn::Linear(input_dim, 1))) {}
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x).squeeze(1); }
  torch::nn::Linear fc;
};
TORCH_MODULE(SimpleModel);

int main() {
  try {
    tandem::init_process_group();
    // The same data on every rank (the seed's randn/randint, seeded): the loader gives each rank its share.
    torch::manual_seed(0);
    const int64_t n_sample = 100, n_dim = 10;
    torch::Tensor x = torch::randn({n_sample, n_dim});
    torch::Tensor y = torch::randint(0, 2, {n_sample}).to(torch::kFloat32);
    auto dataset = tandem::data::make_dataset(SimpleDataset(x, y));

    SimpleModel model(n_dim);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));

    tandem::train::LoopOptions options;
    options.epochs = 10;
    options.batch_size = 10;
    options.lrf = 1;  // a constant rate, as the seed's
    options.loss = [](const torch::Tensor& logits, const torch::Tensor& target) {
      return torch::binary_cross_entropy_with_logits(logits, target);
    };
    tandem::train::Loop loop(options);
    // Rank 0 prints each epoch's mean loss. No evaluation set: accuracy by argmax is for classifiers with one
    // output per class.
    loop.fit(model, optimizer, dataset, nullptr);
    if (tandem::is_main_process()) {
      std::printf("learned weights with norm %.4f, bias %.4f\n", model->fc->weight.norm().item<double>(),
                  model->fc->bias.item<double>());
    }
    tandem::destroy_process_group();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "linear_toy: %s\n", error.what());
    return 1;
  }
}
