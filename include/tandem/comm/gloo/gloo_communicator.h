#pragma once
// The gloo backend: LibTorch's c10d ProcessGroupGloo (TCP between ranks, CPU tensors). Its collectives run on
// Gloo's own worker threads, so they progress while the caller computes.
#include "tandem/comm/c10d/c10d_communicator.h"

namespace tandem::comm {

struct GlooOptions {
  // Address to bind: loopback for ranks on one host, the address that routes to the master across hosts
  // (local_address.h); "" means the address this host's name resolves to. GLOO_SOCKET_IFNAME, as in PyTorch,
  // names an interface instead, and wins.
  std::string hostname = "127.0.0.1";
  // Gloo worker threads: collectives in flight at once (DDP keeps one per bucket in flight).
  int threads = 2;
};

class GlooCommunicator : public C10dCommunicator {
 public:
  GlooCommunicator(StorePtr store, int rank, int world_size, std::chrono::milliseconds timeout,
                   const GlooOptions& options = {});
};

}  // namespace tandem::comm
