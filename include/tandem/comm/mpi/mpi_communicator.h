#pragma once
// The mpi backend: collectives through the MPI C API (Open MPI moves data between processes on one host
// through shared memory, far faster than Gloo's TCP over loopback). Launched by mpirun or srun; the rank
// layout read from their environment must agree with MPI_COMM_WORLD.
//
// Threading: Open MPI's non-blocking collectives only progress inside MPI calls, so a caller computing
// backward would stall them. Instead every MPI call of the process is made by one dedicated thread
// (MpiRuntime) that runs queued collectives in the order they were issued, while the caller's thread goes on
// computing. The runtime initialises MPI once per process (unless the program already did, with at least
// MPI_THREAD_SERIALIZED) and finalises it at exit if it initialised it.
#include <chrono>
#include <memory>
#include <string>

#include "tandem/comm/communicator.h"
#include "tandem/comm/rank_layout.h"

namespace tandem::comm {

class MpiRuntime;
struct MpiGroup;

class MpiCommunicator : public Communicator {
 public:
  // Throws InvalidArgument when MPI's rank or size disagree with `layout` (e.g. started by `tandem run`
  // instead of mpirun), UnsupportedError when MPI was initialised without thread support.
  MpiCommunicator(const RankLayout& layout, std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "mpi"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  // Contract as in Communicator: CPU tensors; the tensors stay referenced by the queued work until it ran.
  // Reductions support float32/64 and integer dtypes; other dtypes throw UnsupportedError.
  WorkPtr all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  WorkPtr broadcast(torch::Tensor& tensor, int root) override;
  WorkPtr all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override;
  WorkPtr reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override;
  WorkPtr barrier() override;

 private:
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<MpiRuntime> runtime_;
  // This communicator's duplicate of MPI_COMM_WORLD and its failure state, shared with queued work.
  std::shared_ptr<MpiGroup> group_;
};

// For a process exiting after an error: aborts the whole MPI job with `exit_code` if MPI was started.
// Finalising instead would wait for the peers, which may wait for this rank until their collective timeout.
void abort_mpi_job(int exit_code) noexcept;

}  // namespace tandem::comm
