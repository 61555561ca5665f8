#include "tandem/util/error.h"

#include "tandem/util/log.h"

namespace tandem {

std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

namespace detail {

std::string rank_tag() {
  return concat("[rank ", log::identity_rank(), "/", log::identity_world_size(), "]");
}

void throw_check_failure(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(concat(rank_tag(), " internal check failed at ", file, ":", line, ": (", condition, ") ",
                             message));
}

}  // namespace detail
}  // namespace tandem
