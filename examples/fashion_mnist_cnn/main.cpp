// The seeds' train_multi_GPU program (seed 000) as a user writes it with tandem: their own CNN, Fashion-MNIST
// sharded across the ranks, SGD with the cosine schedule, accuracy counted over each test sample once.
//
//   tandem run --nproc-per-node 2 -- ./fashion_mnist_cnn [DATA_DIR [EPOCHS [MAX_STEPS]]]
//
// DATA_DIR defaults to Debian's dataset-fashion-mnist; MAX_STEPS > 0 stops early (a smoke run).
#include <tandem/comm/process_group.h>
#include <tandem/data/mnist_dataset.h>
#include <tandem/train/loop.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

// The seed's CNNNet: three 5x5 convolutions (two of them pooled) and three fully connected layers.
struct CnnImpl : torch::nn::Module {
  CnnImpl() {
    const auto conv = [](int64_t in, int64_t out) { return torch::nn::Conv2dOptions(in, out, 5).padding(1); };
    const auto pool = torch::nn::MaxPool2dOptions(2).stride(2).padding(1);
    features = register_module("features", torch::nn::Sequential(
        torch::nn::Conv2d(conv(1, 16)), torch::nn::ReLU(), torch::nn::MaxPool2d(pool),
        torch::nn::Conv2d(conv(16, 32)), torch::nn::ReLU(), torch::nn::MaxPool2d(pool),
        torch::nn::Conv2d(conv(32, 32)), torch::nn::ReLU()));
    classifier = register_module("classifier", torch::nn::Sequential(
        torch::nn::Linear(32 * 5 * 5, 128), torch::nn::ReLU(), torch::nn::Linear(128, 64), torch::nn::ReLU(),
        torch::nn::Linear(64, 10)));
  }
  // Logits: the loss applies log-softmax itself (the seed's softmax before cross-entropy trained on the wrong
  // gradients).
  torch::Tensor forward(torch::Tensor x) { return classifier->forward(features->forward(x).flatten(1)); }

  torch::nn::Sequential features{nullptr}, classifier{nullptr};
};
TORCH_MODULE(Cnn);

int main(int argc, char** argv) {
  try {
    const std::string data_dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    tandem::init_process_group();

    const tandem::data::Normalization fashion{0.2860, 0.3530};
    auto train_set = std::make_shared<tandem::data::MnistDataset>(data_dir, tandem::data::MnistSplit::kTrain, fashion);
    auto test_set = std::make_shared<tandem::data::MnistDataset>(data_dir, tandem::data::MnistSplit::kTest, fashion);

    torch::manual_seed(0);  // every rank builds the same model; DDP then starts all from rank 0's weights
    Cnn model;
    // The per-rank rate; the loop multiplies it by the world size, as the seed does.
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(0.005));

    tandem::train::LoopOptions options;
    options.epochs = argc > 2 ? std::atoi(argv[2]) : 10;
    options.max_steps = argc > 3 ? std::atoll(argv[3]) : 0;
    options.batch_size = 64;
    options.lrf = 0.1;
    tandem::train::Loop loop(options);
    const tandem::train::TrainResult result = loop.fit(model, optimizer, train_set, test_set);

    if (tandem::is_main_process() && !result.epochs.empty()) {
      const auto& last = result.epochs.back();
      std::printf("test accuracy %.4f (%lld of %lld) after %lld steps; checkpoints and metrics in %s\n", last.accuracy,
                  static_cast<long long>(last.correct), static_cast<long long>(last.total),
                  static_cast<long long>(result.steps), result.run_dir.c_str());
    }
    tandem::destroy_process_group();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fashion_mnist_cnn: %s\n", error.what());
    return 1;
  }
}
