#include "tandem/data/image_batch_buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <tuple>

namespace tandem::data {
namespace image_batch_buffers_detail {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// `bytes` rounded up to whole huge pages, aligned to one, so that madvise covers all of it.
void* allocate_on_huge_pages(size_t bytes) {
  void* buffer = std::aligned_alloc(kHugePage, bytes);
  if (!buffer) throw std::bad_alloc();
  // Only advice: where the kernel declines, the buffer is the same.
  ::madvise(buffer, bytes, MADV_HUGEPAGE);
  return buffer;
}

}  // namespace
}  // namespace image_batch_buffers_detail

std::shared_ptr<ImageBatchBuffers> ImageBatchBuffers::create(size_t kept_free) {
  return std::shared_ptr<ImageBatchBuffers>(new ImageBatchBuffers(kept_free));
}

ImageBatchBuffers::~ImageBatchBuffers() {
  for (const auto& [buffer, bytes] : free_) std::free(buffer);
}

torch::Tensor ImageBatchBuffers::take(at::IntArrayRef shape) {
  using namespace image_batch_buffers_detail;
  size_t elements = 1;
  for (int64_t extent : shape) elements *= static_cast<size_t>(extent);
  const size_t needed = (std::max<size_t>(elements, 1) * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
  void* buffer = nullptr;
  size_t bytes = needed;
  std::vector<std::pair<void*, size_t>> too_small;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto fits =
        std::find_if(free_.begin(), free_.end(), [&](const auto& entry) { return entry.second >= needed; });
    if (fits != free_.end()) {
      std::tie(buffer, bytes) = *fits;
      free_.erase(fits);
    } else {
      // Buffers from a smaller batch (an epoch's last) would only hold their places on the list.
      too_small.swap(free_);
    }
  }
  for (const auto& [small, ignored] : too_small) std::free(small);
  if (!buffer) buffer = allocate_on_huge_pages(bytes);
  auto pool = shared_from_this();
  return torch::from_blob(
      buffer, shape, [pool, bytes](void* released) { pool->give_back(released, bytes); }, torch::kFloat);
}

void ImageBatchBuffers::give_back(void* buffer, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < kept_free_) {
      free_.emplace_back(buffer, bytes);
      return;
    }
  }
  std::free(buffer);
}

}  // namespace tandem::data
