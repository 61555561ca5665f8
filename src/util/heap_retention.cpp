#include "tandem/util/heap_retention.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace tandem {
namespace {

#if defined(__GLIBC__)
// Blocks below this come from the heap, whose freed memory is reused, rather than from mmap: above any one
// tensor of the models the benchmarks train, far below a host's memory.
constexpr int kMmapThresholdBytes = 256 << 20;
// Freed memory at the top of the heap is kept up to this much rather than trimmed back to the kernel.
constexpr int kTrimThresholdBytes = 1 << 30;
// Each time the heap grows, it grows by this much more, so that a step's growth is one system call.
constexpr int kTopPadBytes = 256 << 20;

// A user who tuned glibc's malloc through its environment made the choice this would override.
bool malloc_tuned_by_environment() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr;
}
#endif

}  // namespace

void retain_freed_heap_memory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    if (malloc_tuned_by_environment()) return;
    mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
    mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes);
    mallopt(M_TOP_PAD, kTopPadBytes);
  });
#endif
}

}  // namespace tandem
