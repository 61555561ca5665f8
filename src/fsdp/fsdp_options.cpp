#include "tandem/fsdp/fsdp_options.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "tandem/comm/communicator.h"
#include "tandem/util/error.h"

namespace tandem::fsdp {
namespace {

std::string dtype_name(torch::ScalarType dtype) {
  if (dtype == torch::kHalf) return "float16";
  return dtype == torch::kBFloat16 ? "bfloat16" : "float32";
}

void require_floating_dtype(torch::ScalarType dtype, const char* field) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kHalf) {
    throw InvalidArgument(fmt::format("fsdp mixed_precision.{} is {}; use float32, bfloat16 or float16", field,
                                      c10::toString(dtype)));
  }
}

// Every rank reduce-scatters a probe in `dtype`: a backend without it refuses on every rank alike, before the
// backend sends anything.
void require_backend_reduces(comm::Communicator& communicator, torch::ScalarType dtype) {
  torch::Tensor input = torch::zeros({communicator.world_size()}, torch::TensorOptions().dtype(dtype).device(communicator.device()));
  torch::Tensor output = torch::empty({1}, input.options());
  try {
    communicator.reduce_scatter(output, input, comm::ReduceOp::Avg)->wait();
  } catch (const UnsupportedError&) {
    throw UnsupportedError(fmt::format("fsdp reduce_dtype {} needs a backend that reduces {}, and {} in this build "
                                       "does not; set mixed_precision.reduce_dtype to float32, or use a LibTorch 2.x "
                                       "build",
                                       dtype_name(dtype), dtype_name(dtype), communicator.backend_name()));
  }
}

}  // namespace

void require_supported(const MixedPrecision& precision, comm::Communicator* communicator) {
  require_floating_dtype(precision.param_dtype, "param_dtype");
  require_floating_dtype(precision.reduce_dtype_or_param(), "reduce_dtype");
  if (communicator && communicator->world_size() > 1 && precision.reduce_dtype_or_param() != torch::kFloat32) {
    require_backend_reduces(*communicator, precision.reduce_dtype_or_param());
  }
}

}  // namespace tandem::fsdp
