#include "tandem/util/log.h"

#include <cstdio>
#include <mutex>

namespace tandem::log {
namespace {
// rank < 0: no identity, as in a process that never joined a process group (the launcher, `tandem report`).
struct Identity {
  int rank = -1;
  int world_size = 0;
  bool known() const { return rank >= 0; }
};
Identity process_identity;
thread_local Identity thread_identity;

const Identity& current() { return thread_identity.known() ? thread_identity : process_identity; }
}  // namespace

void set_identity(int rank, int world_size) {
  // The first identity set in a process becomes the process default, so threads that the backends start
  // (which never call set_identity) still log with the right rank.
  static std::once_flag first;
  std::call_once(first, [&] { process_identity = {rank, world_size}; });
  thread_identity = {rank, world_size};
}

int identity_rank() { return current().known() ? current().rank : 0; }
int identity_world_size() { return current().known() ? current().world_size : 1; }

std::string line_prefix() {
  const Identity& id = current();
  return id.known() ? fmt::format("[tandem rank {}/{}] ", id.rank, id.world_size) : "tandem: ";
}

void write(const std::string& level, const std::string& message) {
  // One fputs per line keeps lines from different threads whole.
  std::string line = line_prefix() + level + message + "\n";
  std::fputs(line.c_str(), stderr);
}

}  // namespace tandem::log
