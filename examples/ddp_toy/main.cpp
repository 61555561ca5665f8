// DDP on a toy model, the way a user's program would use tandem: fit y = 3x - 1 with a small MLP on every rank
// of `tandem run`, each rank on its own slice of the data, and check that the replicas stay identical.
//
//   tandem run --nproc-per-node 2 -- ./ddp_toy
#include <tandem/comm/process_group.h>
#include <tandem/ddp/distributed_data_parallel.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  try {
    tandem::init_process_group();
    const int rank = tandem::rank();

    // Different initial weights on each rank: DDP broadcasts rank 0's.
    torch::manual_seed(rank);
    torch::nn::Sequential net(torch::nn::Linear(1, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
    tandem::ddp::DistributedDataParallel<torch::nn::Sequential> model(net);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    torch::manual_seed(100 + rank);  // each rank draws its own samples
    for (int step = 1; step <= 200; ++step) {
      torch::Tensor x = torch::rand({32, 1}) * 2 - 1;
      torch::Tensor loss = torch::mse_loss(model(x), 3 * x - 1);
      optimizer.zero_grad();
      loss.backward();  // returns with gradients averaged over all ranks
      optimizer.step();
      torch::Tensor mean_loss = tandem::reduce_value(loss.detach().clone());
      if (step % 50 == 0 && tandem::is_main_process()) {
        std::printf("step %d loss %.5f\n", step, mean_loss.item<float>());
      }
    }

    // Every replica must hold the same weights: compare each rank's with the maximum over ranks.
    std::vector<torch::Tensor> pieces;
    for (const auto& parameter : net->parameters()) pieces.push_back(parameter.detach().flatten());
    torch::Tensor flat = torch::cat(pieces);
    torch::Tensor largest = flat.clone();
    if (tandem::world_size() > 1) {
      tandem::default_group().communicator().all_reduce(largest, tandem::comm::ReduceOp::Max)->wait();
    }
    if (!torch::equal(flat, largest)) {
      std::fprintf(stderr, "rank %d: replicas diverged\n", rank);
      return 1;
    }
    if (tandem::is_main_process()) std::printf("replicas identical on %d ranks\n", tandem::world_size());
    tandem::destroy_process_group();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ddp_toy: %s\n", error.what());
    return 1;
  }
}
