// The nccl backend: every collective at world size 1 on the GPU (the one configuration a one-GPU machine
// allows), a CPU tensor refused by name, and the one-line reasons it will not start: no GPU, more ranks on the
// node than GPUs, or a build without it. The last two run on the CPU machines too.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "support/collective_checks.h"
#include "support/gpu.h"
#include "support/thread_ranks.h"
#include "tandem/comm/backend.h"
#include "tandem/config.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

TEST(NcclOnGpu, WorldOfOneRunsEveryCollectiveOnTheGpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  testing::run_gpu_thread_ranks(1, [](int rank, comm::Communicator& communicator, torch::Device device) {
    ASSERT_EQ(communicator.backend_name(), "nccl");
    EXPECT_EQ(communicator.device(), device);
    for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
      for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) {
        testing::check_all_collectives(rank, communicator, numel, dtype, device);
      }
    }
  });
}

TEST(NcclOnGpu, RefusesCpuTensorsByName) {
  TANDEM_SKIP_WITHOUT_GPU();
  testing::run_gpu_thread_ranks(1, [](int, comm::Communicator& communicator, torch::Device) {
    torch::Tensor on_host = torch::ones({4});
    const std::string message = error_of([&] { communicator.all_reduce(on_host, comm::ReduceOp::Sum)->wait(); });
    EXPECT_NE(message.find("backend nccl does not support cpu tensors in all_reduce(sum)"), std::string::npos)
        << message;
  });
}

TEST(NcclBackend, RefusesMoreRanksOnTheNodeThanGpus) {
  if (!TANDEM_HAVE_NCCL) GTEST_SKIP() << "this build has no nccl backend";
  comm::RankLayout layout;
  layout.world_size = layout.local_world_size = visible_gpu_count() + 1;
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string message = error_of(
      [&] { comm::make_communicator("nccl", store, layout, std::chrono::seconds(5), torch::Device(torch::kCUDA, 0)); });
  const std::string expected = visible_gpu_count() == 0
                                   ? "backend nccl needs a CUDA GPU, and none is visible; use `backend` gloo"
                                   : "and NCCL runs one rank per GPU";
  EXPECT_NE(message.find(expected), std::string::npos) << message;
}

TEST(NcclBackend, AbsentFromABuildWithoutCudaSaysHowToGetIt) {
  if (TANDEM_HAVE_NCCL) GTEST_SKIP() << "this build has the nccl backend";
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string message =
      error_of([&] { comm::make_communicator("nccl", store, comm::RankLayout{}, std::chrono::seconds(5)); });
  EXPECT_NE(message.find("`backend` 'nccl' is not available in this build of tandem"), std::string::npos) << message;
  EXPECT_NE(message.find("LibTorch with CUDA"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
