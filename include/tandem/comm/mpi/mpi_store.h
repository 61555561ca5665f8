#pragma once
// A rendezvous store for a job that mpirun (or srun) started without one. The mpi backend needs no store to
// connect, but its collective tracker does, to name the ranks that never reached a collective. MPI already
// connects every rank, so no address or port has to be agreed on beforehand: rank 0 serves a TCPStore on a
// port the kernel picks and tells the others where over MPI. Used when the user names no rendezvous
// (backend.h: make_rendezvous_store).
#include <chrono>

#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

// Collective over MPI_COMM_WORLD: every rank calls it at the same point. The other ranks connect to the first
// of rank 0's IPv4 addresses that lies in a subnet of one of their own interfaces, or to loopback where rank 0
// has no address outside it. Throws CommError when a rank cannot reach the store, saying to name one instead:
// MASTER_ADDR and MASTER_PORT in every rank's environment (mpirun -x), which env:// then uses.
StorePtr open_store_over_mpi(std::chrono::milliseconds timeout);

}  // namespace tandem::comm
