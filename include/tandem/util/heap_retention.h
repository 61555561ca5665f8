#pragma once
// Keeping freed heap memory in the process, for training loops on the host.
//
// A training step frees and allocates the same tens of megabytes every step (activations, gradients, a
// bucket's copies). By default glibc hands large blocks back to the kernel as soon as they are freed (memory
// above its mmap threshold, and the top of the heap past its trim threshold), so the next step gets fresh pages,
// and the kernel zero-fills each 4 KiB page on its first touch: on the 2-core benchmark VM a 45 MB tensor
// allocated and filled afresh took 26 ms, a copy into mapped memory 4 ms (DDP's step for ResNet-18 at 32x32:
// BENCHMARKS.md, issue 30). Keeping the memory makes each step reuse pages already mapped; the process's
// resident size then stays at its peak step's, which a training loop reaches every step anyway.
namespace tandem {

// Sets glibc's malloc to keep freed memory (mallopt: a high mmap threshold, no trimming, a top pad), once per
// process; later calls do nothing. No effect with another C library, nor where the user tuned malloc through its
// environment (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_ or glibc.malloc tunables). Call it before the first step; memory
// already mapped keeps its old rules.
void retain_freed_heap_memory();

}  // namespace tandem
