#pragma once
// The MPI C API for the mpi backend's sources, and the one check of its return codes.
// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx, which MPI::MPI_C does not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

namespace tandem::comm {

// Throws CommError naming `call` and MPI's text for `code` unless it is MPI_SUCCESS.
void check_mpi(int code, const char* call);

}  // namespace tandem::comm
