#pragma once
// Memory for the image folder's batches, recycled. A batch at training size is tens of MB (38 MB for 64 images
// at 224 px): too large for malloc to keep, so each fresh one would be a new mapping whose pages the kernel
// faults in and zeroes while the decoding threads write them, a quarter of the pipeline's time when measured.
// Instead a batch tensor's memory goes back to its pool when the last reference to the tensor is dropped
// (by whichever thread), and the next batch takes it as it is: the pages stay mapped and are overwritten whole.
// Fresh buffers ask for transparent huge pages (madvise), which Debian's kernels grant only on request, so
// even the first fault costs one per 2 MiB instead of one per 4 KiB.
#include <torch/torch.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem::data {

class ImageBatchBuffers : public std::enable_shared_from_this<ImageBatchBuffers> {
 public:
  // At most `kept_free` released buffers are kept for reuse, the rest freed: the loader holds a few batches at
  // once (the one training, those prefetched), so a couple spare is all a steady epoch needs.
  static std::shared_ptr<ImageBatchBuffers> create(size_t kept_free = 2);
  ~ImageBatchBuffers();
  ImageBatchBuffers(const ImageBatchBuffers&) = delete;
  ImageBatchBuffers& operator=(const ImageBatchBuffers&) = delete;

  // An uninitialised float tensor of `shape` whose memory returns here when the tensor is freed. The pool
  // itself lives as long as any such tensor does. Thread-safe.
  torch::Tensor take(at::IntArrayRef shape);

 private:
  explicit ImageBatchBuffers(size_t kept_free) : kept_free_(kept_free) {}
  void give_back(void* buffer, size_t bytes);

  std::mutex mutex_;
  size_t kept_free_;
  // Released buffers and their sizes; a request takes any one large enough.
  std::vector<std::pair<void*, size_t>> free_;
};

}  // namespace tandem::data
