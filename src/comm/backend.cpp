#include "tandem/comm/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "tandem/comm/gloo/gloo_communicator.h"
#include "tandem/comm/local_address.h"
#include "tandem/config.h"
#include "tandem/util/error.h"
#if TANDEM_HAVE_MPI
#include "tandem/comm/mpi/mpi_communicator.h"
#include "tandem/comm/mpi/mpi_store.h"
#endif
#if TANDEM_HAVE_NCCL
#include "tandem/comm/nccl/nccl_communicator.h"
#endif

namespace tandem::comm {

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"gloo"};
  if (TANDEM_HAVE_MPI) names.push_back("mpi");
  if (TANDEM_HAVE_NCCL) names.push_back("nccl");
  return names;
}

std::string default_backend(const torch::Device& device) { return TANDEM_HAVE_NCCL && device.is_cuda() ? "nccl" : "gloo"; }

namespace {

// Whether the user or the launcher named a rendezvous, which every backend then uses.
bool rendezvous_named(const std::string& init_method, const RankLayout& layout) {
  return init_method != "env://" || layout.launcher_serves_store || !layout.store_file.empty() ||
         process_environment()("MASTER_ADDR").has_value();
}

}  // namespace

StorePtr make_rendezvous_store(const std::string& backend, const std::string& init_method, const RankLayout& layout,
                               std::chrono::milliseconds timeout) {
  // A world of one needs no network: an in-memory store keeps single-process runs free of ports.
  if (!layout.distributed()) return c10::make_intrusive<c10d::HashStore>();
#if TANDEM_HAVE_MPI
  if (backend == "mpi") {
    // Before the ranks wait for each other in the rendezvous, and before anything starts MPI.
    check_started_by_mpi_launcher(layout);
    if (!rendezvous_named(init_method, layout)) return open_store_over_mpi(timeout);
  }
#else
  (void)backend;
#endif
  return make_store(init_method, layout, timeout);
}

CommunicatorPtr make_communicator(const std::string& backend, const StorePtr& store, const RankLayout& layout,
                                  std::chrono::milliseconds timeout, const torch::Device& device) {
  if (backend == "gloo") {
    GlooOptions options;
    // Ranks on one node talk over loopback; across nodes Gloo must bind an address the others can reach, and
    // the one that leads to the master does, where the host name may resolve to loopback.
    if (layout.local_world_size < layout.world_size) options.hostname = local_address_toward(layout.master_addr);
    return std::make_shared<GlooCommunicator>(store, layout.rank, layout.world_size, timeout, options);
  }
#if TANDEM_HAVE_MPI
  if (backend == "mpi") return std::make_shared<MpiCommunicator>(layout, timeout, store);
#endif
#if TANDEM_HAVE_NCCL
  if (backend == "nccl") return std::make_shared<NcclCommunicator>(store, layout, timeout, device);
#endif
  throw UnsupportedError(fmt::format("`backend` '{}' is not available in this build of tandem (available: {}){}",
                                     backend, fmt::join(available_backends(), ", "),
                                     backend == "mpi"    ? "; install libopenmpi-dev and rebuild"
                                     : backend == "nccl" ? "; build against a LibTorch with CUDA (scripts/build --libtorch pypi)"
                                                         : ""));
}

void abort_job_after_error(int exit_code) noexcept {
#if TANDEM_HAVE_MPI
  abort_mpi_job(exit_code);
#else
  (void)exit_code;
#endif
}

}  // namespace tandem::comm
