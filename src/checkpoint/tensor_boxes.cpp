// Tensor boxes (tensor_boxes.h).
#include "tensor_boxes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tandem/util/error.h"

namespace tandem::checkpoint {

TensorAssembly::TensorAssembly(std::string name, std::vector<int64_t> shape, torch::ScalarType dtype,
                               std::string source)
    : name_(std::move(name)), source_(std::move(source)), shape_(std::move(shape)), dtype_(dtype) {}

torch::Tensor TensorAssembly::region(torch::Tensor whole, const std::vector<int64_t>& offsets,
                                     c10::IntArrayRef sizes) const {
  for (size_t d = 0; d < offsets.size(); ++d) whole = whole.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
  return whole;
}

void TensorAssembly::start_copying() {
  tensor_ = torch::empty(shape_, torch::TensorOptions().dtype(dtype_));
  covered_ = torch::zeros(shape_, torch::TensorOptions().dtype(torch::kUInt8));
}

void TensorAssembly::add(const std::vector<int64_t>& offsets, const torch::Tensor& piece) {
  const c10::IntArrayRef sizes = piece.sizes();
  const c10::IntArrayRef shape = shape_;
  bool inside = offsets.size() == shape.size() && sizes.size() == shape.size();
  for (size_t d = 0; inside && d < shape.size(); ++d) {
    inside = offsets[d] >= 0 && sizes[d] <= shape[d] && offsets[d] <= shape[d] - sizes[d];
  }
  if (!inside) {
    throw InvalidArgument(fmt::format("{}: a piece of '{}' at {} of shape {} lies outside its shape {} (the "
                                      "checkpoint is damaged)", source_, name_, offsets, sizes, shape));
  }
  if (!whole_.defined() && !tensor_.defined() && sizes == shape) {
    whole_ = piece.scalar_type() == dtype_ ? piece : piece.to(dtype_);
    return;
  }
  if (!tensor_.defined()) {
    start_copying();
    if (whole_.defined()) {  // a second box after one that covered everything overlaps it
      tensor_.copy_(whole_);
      covered_.fill_(1);
      whole_ = torch::Tensor();
    }
  }
  torch::Tensor covered = region(covered_, offsets, sizes);
  if (covered.numel() > 0 && covered.any().item<bool>()) {
    throw InvalidArgument(fmt::format("{}: the pieces of '{}' overlap at {} (the checkpoint is damaged)", source_,
                                      name_, offsets));
  }
  covered.fill_(1);
  region(tensor_, offsets, sizes).copy_(piece);
}

torch::Tensor TensorAssembly::finish() {
  if (whole_.defined()) return whole_;
  if (!tensor_.defined()) start_copying();
  const int64_t written = covered_.sum().item<int64_t>();
  if (written != tensor_.numel()) {
    throw InvalidArgument(fmt::format("{}: the pieces of '{}' cover {} of its {} elements (a piece is missing: the "
                                      "checkpoint is incomplete or damaged)", source_, name_, written,
                                      tensor_.numel()));
  }
  return tensor_;
}

namespace {

// Row-major strides of `shape` in elements.
std::vector<int64_t> element_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// The boxes of [begin, end) within the sub-tensor at `prefix` (fixed indices of the leading dimensions).
void collect_boxes(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, std::vector<int64_t> prefix,
                   int64_t begin, int64_t end, std::vector<TensorBox>& boxes) {
  const size_t d = prefix.size();
  if (begin >= end) return;
  const int64_t row = strides[d];  // elements per index of dimension d
  const int64_t first_whole = (begin + row - 1) / row;
  const int64_t last_whole = end / row;  // exclusive
  const auto box = [&](int64_t from, int64_t count) {
    TensorBox made;
    made.offsets = prefix;
    made.offsets.push_back(from);
    made.sizes.assign(prefix.size(), 1);
    made.sizes.push_back(count);
    for (size_t rest = d + 1; rest < shape.size(); ++rest) {
      made.offsets.push_back(0);
      made.sizes.push_back(shape[rest]);
    }
    boxes.push_back(std::move(made));
  };
  const auto inside = [&](int64_t index, int64_t from, int64_t to) {
    std::vector<int64_t> deeper = prefix;
    deeper.push_back(index);
    collect_boxes(shape, strides, deeper, from, to, boxes);
  };
  if (begin / row == (end - 1) / row) {
    // Within one index of dimension d, not all of it: a dimension deeper.
    if (end - begin < row) {
      inside(begin / row, begin % row, begin % row + (end - begin));
      return;
    }
  }
  if (begin % row != 0) inside(begin / row, begin % row, row);
  if (first_whole < last_whole) box(first_whole, last_whole - first_whole);
  if (end % row != 0 && end / row >= first_whole) inside(end / row, 0, end % row);
}

}  // namespace

std::vector<TensorBox> boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  if (shape.empty()) return {TensorBox{}};
  std::vector<TensorBox> boxes;
  collect_boxes(shape, element_strides(shape), {}, begin, end, boxes);
  return boxes;
}

}  // namespace tandem::checkpoint
