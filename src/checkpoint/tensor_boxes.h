#pragma once
// Boxes of a tensor: how PyTorch's distributed checkpoints and its sharded safetensors cut tensors (each piece the
// elements [offsets, offsets + sizes) along every dimension), against tandem's own sharded checkpoints, which cut a
// tensor's row-major elements into ranges. Internal to checkpoint/.
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::checkpoint {

// A whole tensor put together from boxes, each checked to lie inside it and to overlap no other; finish() checks
// that they covered it. A first box that covers the whole tensor is taken as it is, uncopied (a tensor saved
// whole). Errors are InvalidArgument beginning with `source` and naming the tensor.
class TensorAssembly {
 public:
  TensorAssembly(std::string name, std::vector<int64_t> shape, torch::ScalarType dtype, std::string source);

  // `piece` holds the box at `offsets`; its shape is the box's sizes. Converted to the tensor's dtype.
  void add(const std::vector<int64_t>& offsets, const torch::Tensor& piece);
  torch::Tensor finish();

 private:
  // The tensor the boxes are copied into, and which of its elements they wrote, made at the first box that does
  // not cover everything (or at finish(), for a tensor no box came for).
  void start_copying();
  torch::Tensor region(torch::Tensor whole, const std::vector<int64_t>& offsets, c10::IntArrayRef sizes) const;

  std::string name_;
  std::string source_;
  std::vector<int64_t> shape_;
  torch::ScalarType dtype_;
  torch::Tensor whole_;     // a first box that covered everything
  torch::Tensor tensor_;    // else the tensor the boxes are copied into, made at the first box
  torch::Tensor covered_;  // one byte per element: 1 once a box wrote it
};

struct TensorBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

// The row-major elements [begin, end) of a tensor of `shape` as boxes, in order: at most two partial boxes per
// dimension around one run of whole rows. A 0-dimensional tensor is one empty box.
std::vector<TensorBox> boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

}  // namespace tandem::checkpoint
