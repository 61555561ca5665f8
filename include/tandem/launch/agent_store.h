#pragma once
// The c10d store of an elastic job, at --rdzv-endpoint HOST:PORT (docs/launcher.md, "Elastic jobs"). The agent on
// the host that owns HOST serves it; every other agent, and every worker of every round, is a client. The store
// host is the one node the job cannot lose, as with torchrun's c10d backend: its agent holds every key.
//
// Which agent serves: one whose host has HOST among its addresses and finds PORT free there; on a host whose
// agent got there first (port taken), or where HOST is not a local address, it connects instead. Where LibTorch
// can serve a socket bound here (compat::serve_from_listening_socket, 2.8 and later) the store listens on
// HOST:PORT only; before that (Debian's 1.13) TCPStore binds PORT on every interface, so keep the port behind
// the cluster's firewall, as for a static job's master.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>

#include "tandem/launch/elastic_options.h"

namespace tandem::launch {

class AgentStore {
 public:
  // Serves the store or connects to it, trying again until `settings.join_timeout` passes; then throws
  // CommError in one line naming the endpoint and what went wrong the last time. Store operations of the client
  // give up after `operation_timeout` (a lost link is found out rather than waited on). A peer that is no store
  // (it talks first, answers as no store does, or accepts and never answers: comm/store_probe.h) is one more failed
  // try, never handed to c10d's client. `say`, where given, hears once what the agent waits for, after the first
  // try that failed. `stop` is asked while the agent waits (every 100 ms, on this thread): once it says yes,
  // client() stays null.
  AgentStore(const ElasticSettings& settings, std::chrono::milliseconds operation_timeout,
             std::function<void(const std::string&)> say = {}, const std::function<bool()>& stop = [] { return false; });
  AgentStore(const AgentStore&) = delete;
  AgentStore& operator=(const AgentStore&) = delete;

  bool hosting() const { return hosting_; }
  // This agent's connection: the serving store itself where this agent hosts it.
  const c10::intrusive_ptr<c10d::Store>& client() const { return client_; }
  // A fresh connection after the old one was lost, trying until `deadline`; throws CommError like the
  // constructor. Where this agent hosts the store, the store itself. `stop` is asked while it waits, as by the
  // constructor: once it says yes, returns null.
  c10::intrusive_ptr<c10d::Store> reconnect(std::chrono::steady_clock::time_point deadline,
                                            const std::function<bool()>& stop = [] { return false; });

 private:
  ElasticSettings settings_;
  std::chrono::milliseconds operation_timeout_;
  std::function<void(const std::string&)> say_;
  bool said_waiting_ = false;
  bool hosting_ = false;
  c10::intrusive_ptr<c10d::Store> client_;
};

// True when `host` names an address of this machine (in this network namespace), found by binding it.
bool is_local_address(const std::string& host);

}  // namespace tandem::launch
