// derived.h -- data the runtime derives from a tensor's contents and keeps across calls (oneDNN's
// reordered convolution weights, a linear layer's weight packed for the GEMM). It is reused while
// the tensor has the same address, the same version (the caller's write count,
// DYNAMO_ARG_FLAG_VERSIONED: PyTorch's version counter) and the same 32 sampled elements: the
// sample catches a new tensor that took a freed one's address and version, and whole-tensor
// writes through `.data`, which PyTorch does not count. Without a version nothing is kept.
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace dynamo::runtime {

// The elements a content key samples: kContentSamples of them, evenly spaced in row-major
// order over a tensor of n > 0 elements; sample s's offset in elements (strides in elements).
constexpr int64_t kContentSamples = 32;
inline int64_t content_sample_offset(int64_t s, int64_t n, int ndim, const int64_t *sizes, const int64_t *strides) {
  int64_t li = (s * (n - 1)) / (kContentSamples - 1), off = 0;
  for (int d = ndim - 1; d >= 0; --d) {  // unravel li over the sizes, row-major
    off += (li % sizes[d]) * strides[d];
    li /= sizes[d];
  }
  return off;
}

struct ContentKey {
  const void *ptr = nullptr;
  uint64_t version = 0;
  std::vector<float> sample;

  // The key of float32 tensor t (any strides) at this version.
  static ContentKey of(const at::Tensor &t, uint64_t version) {
    ContentKey k;
    k.ptr = t.data_ptr();
    k.version = version;
    const float *p = t.data_ptr<float>();
    int64_t n = t.numel();
    for (int64_t s = 0; s < kContentSamples && n > 0; ++s)
      k.sample.push_back(p[content_sample_offset(s, n, (int)t.dim(), t.sizes().data(), t.strides().data())]);
    return k;
  }
  bool operator==(const ContentKey &o) const {  // bitwise: NaN samples match themselves
    return ptr == o.ptr && version == o.version && sample.size() == o.sample.size() &&
           !memcmp(sample.data(), o.sample.data(), sample.size() * sizeof(float));
  }
};

// One kept derivation of type T, safe to share between threads running the same entry.
template <typename T>
class Derived {
 public:
  // The kept value if key matches it, else make() (kept under key when keep is set).
  template <typename Make>
  std::shared_ptr<const T> get(const ContentKey *key, Make make) {
    if (key) {
      std::lock_guard<std::mutex> g(mu_);
      if (value_ && key_ == *key) return value_;
    }
    auto v = std::make_shared<const T>(make());
    if (key) {
      std::lock_guard<std::mutex> g(mu_);
      value_ = v;
      key_ = *key;
    }
    return v;
  }

  // Forgets the kept value (a path the step no longer takes).
  void clear() {
    std::lock_guard<std::mutex> g(mu_);
    value_.reset();
    key_ = ContentKey{};
  }

 private:
  std::mutex mu_;
  std::shared_ptr<const T> value_;
  ContentKey key_;
};

}  // namespace dynamo::runtime
