// The seeds' ResNet-34 program (seed 001) as a user writes it with tandem: an image folder (one sub-folder per
// class) split into training and validation sets, pretrained weights whose tensors are kept only where their
// shape fits (the classifier head of another class count does not), the other layers frozen, SGD over what is
// left, the augmentation re-drawn each epoch.
//
//   tandem run --nproc-per-node 2 -- ./resnet34_image_folder IMAGE_DIR [WEIGHTS [IMAGE_SIZE [MAX_STEPS]]]
//
// WEIGHTS is a safetensors file of a ResNet-34 state dict under PyTorch's names ("" or absent: start from
// scratch and train every layer).
#include <tandem/checkpoint/weights.h>
#include <tandem/comm/process_group.h>
#include <tandem/data/data_folder.h>
#include <tandem/nn/resnet.h>
#include <tandem/train/loop.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  try {
    if (argc < 2) {
      std::fprintf(stderr, "usage: resnet34_image_folder IMAGE_DIR [WEIGHTS [IMAGE_SIZE [MAX_STEPS]]]\n");
      return 2;
    }
    const std::string weights = argc > 2 ? argv[2] : "";
    tandem::init_process_group();

    tandem::data::DataFolderOptions folder;
    folder.dir = argv[1];
    folder.image_size = argc > 3 ? std::atoll(argv[3]) : 224;
    folder.val_split = 0.2;
    tandem::data::DataFolder data = tandem::data::open_data_folder(folder);

    torch::manual_seed(0);
    tandem::nn::ResNet model = tandem::nn::resnet34(data.num_classes);
    if (!weights.empty()) {
      // Tensors whose name or shape differs from the model's are skipped and listed: the seed compared only
      // element counts, which lets a transposed tensor in.
      const tandem::checkpoint::LoadReport report = tandem::checkpoint::load_weights(*model, weights);
      if (tandem::is_main_process()) {
        std::printf("loaded %zu tensors from %s\n", report.loaded.size(), weights.c_str());
        for (const std::string& skipped : report.skipped) std::printf("  skipped %s\n", skipped.c_str());
      }
      // With pretrained features, train only the classifier head (the seed's --freeze-layers).
      for (auto& parameter : model->named_parameters()) {
        if (parameter.key().rfind("fc.", 0) != 0) parameter.value().requires_grad_(false);
      }
    }
    std::vector<torch::Tensor> trainable;
    for (const auto& parameter : model->parameters()) {
      if (parameter.requires_grad()) trainable.push_back(parameter);
    }
    torch::optim::SGD optimizer(trainable, torch::optim::SGDOptions(0.001).momentum(0.9).weight_decay(0.005));

    tandem::train::LoopOptions options;
    options.epochs = 30;
    options.batch_size = 16;
    options.max_steps = argc > 4 ? std::atoll(argv[4]) : 0;
    tandem::train::Loop loop(options);
    // A new crop and flip for every sample each epoch, the same on every rank.
    loop.callbacks().on_epoch_start = [&](int epoch) { data.image_train->set_epoch(epoch); };
    const tandem::train::TrainResult result = loop.fit(model, optimizer, data.train, data.eval);

    if (tandem::is_main_process() && !result.epochs.empty()) {
      std::printf("validation accuracy %.4f over %lld images of %zu classes\n", result.epochs.back().accuracy,
                  static_cast<long long>(result.epochs.back().total), data.classes.size());
    }
    tandem::destroy_process_group();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "resnet34_image_folder: %s\n", error.what());
    return 1;
  }
}
