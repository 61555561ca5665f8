#pragma once
// The rendezvous store that `tandem run` serves to the workers of a single-node run (docs/launcher.md, "The
// rendezvous store of one node"). Every rank runs on this machine, so the store is reachable from this machine
// only; it is up before the first worker starts and stays up until the launcher returns.
//
// Where LibTorch's TCPStore can serve a socket bound here (compat::serve_from_listening_socket), the launcher
// binds MASTER_ADDR:MASTER_PORT itself and serves the store from that socket, as torchrun's agent does: the
// port is held from the moment it is chosen, and every rank, rank 0 too, connects as a client. Elsewhere
// (LibTorch before 2.8) TCPStore would listen on every interface, so the workers share a c10d FileStore in a
// directory only this user can enter, and MASTER_PORT is only checked, for programs other than tandem's.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <string>

namespace tandem::launch {

class LocalStore {
 public:
  // `address` is an IPv4 loopback address (plan_launch checks it); `port` 0 picks a free one. Throws CommError
  // naming the port when it is taken.
  LocalStore(const std::string& address, int port);
  ~LocalStore();
  LocalStore(const LocalStore&) = delete;
  LocalStore& operator=(const LocalStore&) = delete;

  // MASTER_PORT for the workers: the port asked for, or the free one picked.
  int port() const { return port_; }
  // What, besides MASTER_ADDR and MASTER_PORT, leads the workers of attempt `restart_count` (0 for the first
  // start) to this store, fresh for that attempt: TORCHELASTIC_USE_AGENT_STORE=True, with which the workers keep
  // their keys under the attempt's prefix (TORCHELASTIC_RESTART_COUNT, set by worker_environment); or
  // TANDEM_STORE_FILE, a file of the attempt's own.
  std::map<std::string, std::string> worker_variables(int restart_count) const;
  // The launcher's own client on the keys of attempt `restart_count`: in-job recovery publishes its memberships
  // there (comm/membership.h).
  c10::intrusive_ptr<c10d::Store> attempt_store(int restart_count, int workers) const;

 private:
  int port_ = 0;
  c10::intrusive_ptr<c10d::Store> tcp_store_;  // serving from the socket bound here; null with a FileStore
  std::string file_store_directory_;           // removed with everything in it; empty with a TCPStore
};

}  // namespace tandem::launch
