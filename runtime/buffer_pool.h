// buffer_pool.h -- recycled, 64-byte-aligned host buffers for outputs and scratch.
//
// Large fresh allocations are expensive on Linux: glibc hands blocks above its mmap threshold
// straight to the kernel and back, so every call pays one page fault per 4 KiB touched (on
// the 2-vCPU VMs we measure on, a fresh 64 MB buffer costs more than the kernel that fills
// it). The engine keeps released buffers, bounded in total bytes, and hands them out again.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace dynamo::runtime {

struct Buffer {
  void *data = nullptr;
  size_t capacity = 0;  // bytes actually allocated (>= the request)
};

class BufferPool {
 public:
  explicit BufferPool(size_t limit_bytes) : limit_(limit_bytes) {}
  ~BufferPool();
  BufferPool(const BufferPool &) = delete;
  BufferPool &operator=(const BufferPool &) = delete;

  // A buffer of at least `bytes` (64-byte aligned). Reuses a cached one that is at most 1/8
  // larger, else allocates. data == nullptr when out of memory.
  Buffer acquire(size_t bytes);
  // Returns a buffer to the cache, or frees it when the cache would exceed its limit.
  void release(Buffer b);

  size_t cached_bytes() const;
  size_t limit_bytes() const { return limit_; }

 private:
  mutable std::mutex mu_;
  std::multimap<size_t, void *> free_;  // capacity -> buffer
  size_t cached_ = 0;
  size_t limit_;
};

}  // namespace dynamo::runtime
