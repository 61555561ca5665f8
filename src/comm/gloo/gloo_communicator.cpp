#include "tandem/comm/gloo/gloo_communicator.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

namespace tandem::comm {
namespace {

std::shared_ptr<::gloo::transport::Device> make_device(const std::string& hostname) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  if (hostname.empty()) return c10d::ProcessGroupGloo::createDefaultDevice();
  return c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
}

}  // namespace

GlooCommunicator::GlooCommunicator(StorePtr store, int rank, int world_size, std::chrono::milliseconds timeout,
                                   const GlooOptions& options)
    // c10d's Gloo has no average (the base divides and sums); its reduce-scatter and all-gather into one tensor
    // depend on the LibTorch version (compat.h), the base emulating them where they are missing.
    : C10dCommunicator("gloo", store, rank, world_size, timeout,
                       Capabilities{/*average=*/false, /*reduce_scatter=*/compat::kGlooHasTensorCollectives,
                                    /*tensor_device=*/std::nullopt,
                                    /*all_gather_into=*/compat::kGlooHasTensorCollectives}) {
  connect([&] {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo_options->devices.push_back(make_device(options.hostname));
    gloo_options->threads = options.threads;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
  });
}

}  // namespace tandem::comm
