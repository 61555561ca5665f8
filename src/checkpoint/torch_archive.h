#pragma once
// One `torch.save` archive, as the `.distcp` files of PyTorch's distributed checkpoints hold one per item: a stored
// zip of `archive/data.pkl` (the pickled object; for a tensor, `torch._utils._rebuild_tensor_v2` of a persistent
// storage id, offset, size and stride), `archive/data/<key>` (each storage's raw little-endian bytes), `byteorder`
// and `version`. Internal to checkpoint/.
#include <torch/types.h>

#include <functional>
#include <string>
#include <string_view>

#include "pickle.h"

namespace tandem::checkpoint {

// The tensor the archive in `bytes` (a one-dimensional uint8 tensor on the CPU) holds, contiguous: a view into
// `bytes` where the stored layout is already contiguous, so that a large piece is read once and never copied.
// Throws InvalidArgument beginning with `source` when the bytes are not such an archive or its pickle names anything
// but a tensor's rebuild.
torch::Tensor read_torch_archive_tensor(const torch::Tensor& bytes, const std::string& source);
// The plain value an archive holds (a number, a string, a tuple or list of them): its pickle, read bounded.
PickleDocument read_torch_archive_value(std::string_view bytes, const std::string& source);

// Writes the archive of one tensor (saved contiguous, as PyTorch's readers expect; its data handed to `append`
// uncopied), or of one plain value already pickled; returns the archive's size.
using ArchiveAppender = std::function<void(std::string_view)>;
uint64_t write_torch_archive_of_tensor(const torch::Tensor& tensor, const ArchiveAppender& append);
uint64_t write_torch_archive_of_value(const std::string& pickle, const ArchiveAppender& append);

}  // namespace tandem::checkpoint
