#pragma once
// The mpi backend: collectives through the MPI C API (Open MPI moves data between processes on one host
// through shared memory, far faster than Gloo's TCP over loopback). Launched by mpirun or srun; the rank
// layout read from their environment must agree with MPI_COMM_WORLD.
//
// Threading: every MPI call of the process is made by one dedicated thread (src/comm/mpi/mpi_runtime.h), so
// that collectives progress while the caller's thread computes.
#include <chrono>
#include <memory>

#include "tandem/comm/communicator.h"
#include "tandem/comm/rank_layout.h"

namespace tandem::comm {

class MpiRuntime;
struct MpiGroup;

// Refuses a world of several ranks that no MPI launcher started (`tandem run`, torchrun, a layout the caller
// gave), before anything initialises MPI: MPI_Init would make each process a world of its own, and the abort
// after the error prints Open MPI's banner on every rank. An MPI launcher leaves OMPI_COMM_WORLD_SIZE (Open
// MPI's mpirun), PMI_RANK or PMIX_RANK (MPICH, Slurm's srun) in the environment; a layout read from Slurm counts
// too. Throws InvalidArgument.
void check_started_by_mpi_launcher(const RankLayout& layout, const EnvLookup& env = process_environment());

class MpiCommunicator : public Communicator {
 public:
  // `store` is the ranks' rendezvous store (for the collective tracker); under mpirun, open_store_over_mpi()
  // makes one. Throws InvalidArgument when no MPI launcher started a world of several ranks (see
  // check_started_by_mpi_launcher) or MPI's rank or size disagree with `layout`, UnsupportedError when MPI was
  // initialised without thread support.
  MpiCommunicator(const RankLayout& layout, std::chrono::milliseconds timeout, StorePtr store);
  ~MpiCommunicator() override;

 protected:
  // CPU tensors; they stay referenced by the queued work until it ran. Reductions support float32/64 and
  // integer dtypes; other dtypes throw UnsupportedError.
  WorkPtr start_all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  WorkPtr start_broadcast(torch::Tensor& tensor, int root) override;
  WorkPtr start_all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override;
  WorkPtr start_all_gather_into(torch::Tensor& output, const torch::Tensor& input) override;
  WorkPtr start_reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override;
  WorkPtr start_barrier() override;

 private:
  std::shared_ptr<MpiRuntime> runtime_;
  // This communicator's duplicate of MPI_COMM_WORLD and its failure state, shared with queued work.
  std::shared_ptr<MpiGroup> group_;
};

// For a process exiting after an error: aborts the whole MPI job with `exit_code` if MPI was started.
// Finalising instead would wait for the peers, which may wait for this rank until their collective timeout.
void abort_mpi_job(int exit_code) noexcept;

}  // namespace tandem::comm
