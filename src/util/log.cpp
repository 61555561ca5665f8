#include "tandem/util/log.h"

#include <cstdio>
#include <mutex>

namespace tandem::log {
namespace {
struct Identity {
  int rank = -1;
  int world_size = 0;
};
Identity process_identity{0, 1};
thread_local Identity thread_identity;

const Identity& current() { return thread_identity.rank >= 0 ? thread_identity : process_identity; }
}  // namespace

void set_identity(int rank, int world_size) {
  // The first identity set in a process becomes the process default, so threads that the backends start
  // (which never call set_identity) still log with the right rank.
  static std::once_flag first;
  std::call_once(first, [&] { process_identity = {rank, world_size}; });
  thread_identity = {rank, world_size};
}

int identity_rank() { return current().rank; }
int identity_world_size() { return current().world_size; }

void write(const std::string& level, const std::string& message) {
  const Identity& id = current();
  // One fputs per line keeps lines from different threads whole.
  std::string line = fmt::format("[tandem rank {}/{}] {}{}\n", id.rank, id.world_size, level, message);
  std::fputs(line.c_str(), stderr);
}

}  // namespace tandem::log
