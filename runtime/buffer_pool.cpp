// buffer_pool.cpp -- see buffer_pool.h.
#include "buffer_pool.h"

#include "jit/ir.h"

#include <cstdlib>

namespace dynamo::runtime {

namespace {
size_t round_capacity(size_t bytes) {
  size_t unit = bytes >= (size_t(1) << 20) ? 4096 : 64;  // whole pages for big buffers
  return (bytes + unit - 1) / unit * unit;
}
}  // namespace

BufferPool::~BufferPool() {
  for (auto &kv : free_) free(kv.second);
}

Buffer BufferPool::acquire(size_t bytes) {
  size_t cap = round_capacity(bytes ? bytes : 1);
  if (jit::fault_injected("alloc")) return Buffer{nullptr, cap};  // tests: allocation failure
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = free_.lower_bound(cap);
    if (it != free_.end() && it->first <= cap + cap / 8) {
      Buffer b{it->second, it->first};
      cached_ -= it->first;
      free_.erase(it);
      return b;
    }
  }
  return Buffer{aligned_alloc(64, cap), cap};
}

void BufferPool::release(Buffer b) {
  if (!b.data) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (cached_ + b.capacity <= limit_) {
      free_.emplace(b.capacity, b.data);
      cached_ += b.capacity;
      return;
    }
  }
  free(b.data);
}

size_t BufferPool::cached_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return cached_;
}

}  // namespace dynamo::runtime
