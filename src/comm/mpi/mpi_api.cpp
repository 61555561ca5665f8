#include "mpi_api.h"

#include <fmt/format.h>

#include <string>

#include "tandem/util/error.h"

namespace tandem::comm {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(fmt::format("{} failed: {}; a peer process has probably exited, see its output", call,
                              std::string(text, static_cast<size_t>(length))));
}

}  // namespace tandem::comm
