#pragma once
// `tandem bench memory` as a whole. For each world size N the driver starts one N-rank job of this program
// through `tandem run`; every rank runs the measurement of bench/memory/memory_bench.h and writes its result, and the
// driver prints, per N, the largest rank's bytes of parameters, gradients and AdamW state, FSDP's peak of gathered
// parameters, peak resident memory, and what DDP would need at that N (16 bytes per parameter per rank:
// parameters, gradients and AdamW's two moments, all float32). Before anything starts it refuses a run whose
// estimate does not fit in this host's available memory, so that a DDP run too large for the machine is one
// line, not a swapping machine or a killed job.
#include <string>
#include <vector>

#include "bench/memory/memory_bench.h"

namespace tandem::bench {

struct MemoryDriverOptions {
  MemoryBenchOptions bench;
  std::vector<int> world_sizes{1, 2, 4};
  int threads = 1;        // intra-op threads per rank
  std::string json_path;  // empty: no JSON
  std::string program;    // this program: the ranks (memory_worker.h), and `run`, which starts them
};

// The bytes one rank is expected to hold at its peak: DDP 16 per parameter; FSDP the whole float32 model while
// it is built (every rank builds it before sharding), or its 16-byte share plus six of the largest unit (two
// gathered, and the one reduction in flight's gradient buffers, as measured), whichever is more. DDP's is a lower
// bound: it leaves out the buckets' copies, activations and the allocator's slack.
int64_t estimated_bytes_per_rank(const MemoryBenchOptions& options, int64_t parameters, int world_size);

// Throws InvalidArgument where a world size's estimate exceeds the memory the host has available (naming both
// and what to change), and CommError when a job fails.
void run_memory_driver(MemoryDriverOptions options);

// The host's MemAvailable from /proc/meminfo, in bytes (physical memory where it has none).
int64_t available_memory_bytes();

}  // namespace tandem::bench
