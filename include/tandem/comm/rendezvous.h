#pragma once
// Rendezvous: the key-value store through which ranks find each other (c10d's TCPStore or FileStore), and a
// join step that checks every rank arrived with the same world size before any backend connects.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "tandem/comm/rank_layout.h"

namespace tandem::comm {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// init_method is "env://" (master address and port from the layout, or the layout's store_file),
// "tcp://host:port" or "file:///path". Rank 0 hosts the TCP store, unless with env:// the launcher serves it
// (layout.launcher_serves_store; then under the prefix of attempt layout.restart_count). Throws InvalidArgument for an unknown scheme, CommError when the master cannot
// be reached or its port is taken, each with what to do about it.
StorePtr make_store(const std::string& init_method, const RankLayout& layout, std::chrono::milliseconds timeout);

// The keys of launcher attempt `restart_count` in the store the launcher serves (PyTorch's env:// names them so).
StorePtr attempt_keys(const StorePtr& store, int restart_count);

// Announces this rank in the store and waits for all the others. Fails with TimeoutError listing the ranks
// that never joined, InvalidArgument when two processes claim one rank or the world sizes disagree, or CommError
// within `timeout` when the store's address answers as no store does (or not at all). Past that deadline a
// request may still wait on a thread of its own, which keeps `store` alive.
void join(const StorePtr& store, int rank, int world_size, std::chrono::milliseconds timeout);

// A store's values are bytes; the control plane keeps text in them.
inline std::vector<uint8_t> store_bytes(const std::string& text) { return {text.begin(), text.end()}; }
inline std::string store_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// "1, 3, 5" or "1-3, 7" for messages that name ranks.
std::string describe_ranks(const std::vector<int>& ranks);

}  // namespace tandem::comm
