#pragma once
// The factory that turns a backend name into a Communicator. Backends absent from this build (see
// tandem/config.h) are refused by name, with the reason.
#include <chrono>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/comm/rank_layout.h"
#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

// Backends compiled into this build, e.g. {"gloo", "mpi"}.
std::vector<std::string> available_backends();

// "nccl" for ranks that compute on a GPU (where the backend was built), "gloo" otherwise.
std::string default_backend(const torch::Device& device);

// The store in which the ranks of `backend` meet (rendezvous.h): an in-memory one for a world of one, else the
// one `init_method` names. Under mpi with env:// and no MASTER_ADDR in the environment nor a launcher's store,
// nothing names one, and MPI itself brings the ranks together: rank 0 opens a store and tells the others over
// MPI (mpi/mpi_store.h).
StorePtr make_rendezvous_store(const std::string& backend, const std::string& init_method, const RankLayout& layout,
                               std::chrono::milliseconds timeout);

// Connects this rank, which computes on `device`, to the others. Throws UnsupportedError for a backend that this
// build lacks.
CommunicatorPtr make_communicator(const std::string& backend, const StorePtr& store, const RankLayout& layout,
                                  std::chrono::milliseconds timeout, const torch::Device& device = torch::kCPU);

// For a rank exiting after an error: ends the job at once where its backend needs that (mpi aborts the MPI
// job; its finalisation would wait for the peers). Gloo's and NCCL's peers see the closed connections instead.
void abort_job_after_error(int exit_code) noexcept;

}  // namespace tandem::comm
