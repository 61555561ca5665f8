#include "tandem/comm/collective_signature.h"

#include <fmt/format.h>

namespace tandem::comm {
namespace {

// PyTorch's name of a dtype ("float32", "bfloat16", "int64"), as a user reads it in torch.
std::string torch_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::Double:
      return "float64";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::ComplexHalf:
      return "complex32";
    case c10::ScalarType::ComplexFloat:
      return "complex64";
    case c10::ScalarType::ComplexDouble:
      return "complex128";
    case c10::ScalarType::Byte:
      return "uint8";
    case c10::ScalarType::Char:
      return "int8";
    case c10::ScalarType::Short:
      return "int16";
    case c10::ScalarType::Int:
      return "int32";
    case c10::ScalarType::Long:
      return "int64";
    case c10::ScalarType::Bool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

}  // namespace

std::string CollectiveSignature::describe() const {
  if (!dtype) return kind;
  return fmt::format("{} {}[{}]", kind, torch_dtype_name(*dtype), numel);
}

}  // namespace tandem::comm
