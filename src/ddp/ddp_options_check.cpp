#include "ddp_options_check.h"

#include <fmt/format.h>

#include "tandem/ddp/comm_hook.h"
#include "tandem/util/error.h"

namespace tandem::ddp {

void check_ddp_options(const DdpOptions& options) {
  if (options.bucket_cap_mb <= 0 || options.first_bucket_cap_mb <= 0) {
    throw InvalidArgument(fmt::format("bucket_cap_mb ({}) and first_bucket_cap_mb ({}) must be positive",
                                      options.bucket_cap_mb, options.first_bucket_cap_mb));
  }
  if (options.check_replicas_every < 0) {
    throw InvalidArgument(fmt::format("check_replicas_every must be >= 0 (0: never), got {}", options.check_replicas_every));
  }
}

std::string describe_ddp_options(const DdpOptions& options) {
  return fmt::format("bucket_cap_mb={} first_bucket_cap_mb={} bucket_plan={} broadcast_buffers={} "
                     "find_unused_parameters={} static_graph={} gradient_as_bucket_view={} "
                     "comm_hook={} check_replicas_every={}",
                     options.bucket_cap_mb, options.first_bucket_cap_mb,
                     options.bucket_plan == BucketPlan::kCaps ? "caps" : "adapt-to-host", options.broadcast_buffers,
                     options.find_unused_parameters, options.static_graph, options.gradient_as_bucket_view,
                     options.comm_hook->name(), options.check_replicas_every);
}

}  // namespace tandem::ddp
