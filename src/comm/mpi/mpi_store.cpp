#include "tandem/comm/mpi/mpi_store.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_api.h"
#include "mpi_runtime.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// One IPv4 address of an interface that is up, with its netmask, in host byte order.
struct Ipv4Interface {
  uint32_t address = 0;
  uint32_t netmask = 0;
};

std::vector<Ipv4Interface> local_ipv4_interfaces() {
  ifaddrs* found = nullptr;
  if (::getifaddrs(&found) != 0) return {};
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> interfaces(found, ::freeifaddrs);
  std::vector<Ipv4Interface> result;
  for (const ifaddrs* entry = found; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_netmask == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if (!(entry->ifa_flags & IFF_UP) || (entry->ifa_flags & IFF_LOOPBACK)) continue;
    result.push_back({ntohl(reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr.s_addr),
                      ntohl(reinterpret_cast<const sockaddr_in*>(entry->ifa_netmask)->sin_addr.s_addr)});
  }
  return result;
}

std::string ipv4_text(uint32_t address) {
  in_addr raw{htonl(address)};
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &raw, text, sizeof(text));
  return text;
}

// "PORT ADDRESS ADDRESS ..." (addresses as numbers): what rank 0 tells the others.
std::string describe_server(int port, const std::vector<Ipv4Interface>& interfaces) {
  std::string text = std::to_string(port);
  for (const auto& interface : interfaces) text += " " + std::to_string(interface.address);
  return text;
}

// The address of rank 0 that this rank reaches directly: one in a subnet of this rank's own interfaces.
std::string reachable_server_address(const std::vector<uint32_t>& server_addresses) {
  const std::vector<Ipv4Interface> mine = local_ipv4_interfaces();
  for (uint32_t server : server_addresses) {
    for (const auto& interface : mine) {
      if ((server & interface.netmask) == (interface.address & interface.netmask)) return ipv4_text(server);
    }
  }
  return server_addresses.empty() ? "127.0.0.1" : ipv4_text(server_addresses.front());
}

// Rank 0's description to every rank, through MPI_COMM_WORLD on the MPI thread.
std::string broadcast_from_rank0(MpiRuntime& runtime, const std::string& text) {
  std::string received = text;
  runtime.run_sync([&] {
    int length = static_cast<int>(received.size());
    check_mpi(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
    received.resize(static_cast<size_t>(length));
    check_mpi(MPI_Bcast(received.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  });
  return received;
}

}  // namespace

StorePtr open_store_over_mpi(std::chrono::milliseconds timeout) {
  std::shared_ptr<MpiRuntime> runtime = MpiRuntime::instance();
  int rank = 0, size = 1;
  runtime->run_sync([&] {
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  });
  c10d::TCPStoreOptions options;
  options.numWorkers = size;
  options.waitWorkers = false;
  options.timeout = timeout;
  if (rank == 0) {
    options.isServer = true;
    options.port = 0;  // the kernel picks a free one
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::string announcement;
    try {
      store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
      announcement = describe_server(store->getPort(), local_ipv4_interfaces());
    } catch (const std::exception& error) {
      announcement = "0";  // tells the others that there is no store, so that they fail as well
      broadcast_from_rank0(*runtime, announcement);
      throw CommError(fmt::format("rank 0 could not open a rendezvous store for the mpi job ({}); name one for "
                                  "every rank with mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT",
                                  error.what()));
    }
    broadcast_from_rank0(*runtime, announcement);
    return store;
  }
  std::istringstream announcement(broadcast_from_rank0(*runtime, ""));
  int port = 0;
  announcement >> port;
  if (port == 0) throw CommError("rank 0 could not open a rendezvous store for the mpi job; see its output");
  std::vector<uint32_t> server_addresses;
  for (uint32_t address = 0; announcement >> address;) server_addresses.push_back(address);
  const std::string host = reachable_server_address(server_addresses);
  options.port = static_cast<uint16_t>(port);
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& error) {
    throw CommError(fmt::format("rank {} could not reach rank 0's rendezvous store at {}:{} ({}); name a store that "
                                "every rank reaches with mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT",
                                rank, host, port, error.what()));
  }
}

}  // namespace tandem::comm
