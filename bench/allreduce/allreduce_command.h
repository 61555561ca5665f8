#pragma once
// `tandem bench allreduce` as a whole, run as every rank of a job: joins the process group, measures rank 0's
// memcpy ceiling, prints one table row per size as it is measured (rank 0) and writes the rows as JSON.
#include <string>

namespace tandem::bench {

struct AllreduceCommandOptions {
  std::string device = "auto";  // where the buffer lives: cpu, cuda (GPU LOCAL_RANK) or auto
  std::string backend;          // empty: comm::default_backend() (nccl on a GPU where built in, else gloo)
  std::string sizes = "4K..64M";  // parse_sizes()
  int iters = 0;                  // timed all-reduces per size; 0: iterations_for()
  int warmup = 2;
  std::string memcpy_size = "64M";
  std::string json_path;  // empty: no JSON
  int timeout_s = 300;    // before a collective counts as hung
};

// Collective. Throws CommError, after the table and the JSON, when an all-reduce gave a wrong result (the
// table's check column).
void run_allreduce_command(const AllreduceCommandOptions& options);

}  // namespace tandem::bench
