// gemm.cpp -- packed float32 GEMM: B packed into panels of 32 columns per K block; A either
// read in place by a 12x32 micro-kernel (24 accumulator vectors; A's rows contiguous, B packed
// ahead: a kept weight, Winograd's transformed tiles) or packed into panels of 6 rows for a 6x32
// one (12 accumulators; one broadcast of A and two loads of B per step). The kernels are built
// for three levels (isa.h: x86-64-v4 with 16-float vectors, v3 with 8-float ones in tiles that fit
// AVX2's 16 registers, the portable code) and kernel_isa() picks one per call.
// Accumulation order is plain k order per output, like a reference BLAS.
#include "gemm.h"
#include "isa.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

namespace dynamo::runtime {

namespace {

constexpr int MR = 6, NR = 32;
constexpr int RR = 12;  // rows of the in-place kernel (micro_kernel_rows)
constexpr int DR = 6, DC = 4;  // dot_tile: rows of A, columns of B
constexpr int64_t KC = 256, MC = 96, NC = 256;
constexpr int64_t kRowRuns = 8;  // sgemv over B's rows: runs of rows summed apart (as many on any machine)

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));
// VecOf<W>::type: W floats, loaded and stored at any 4-byte alignment. (Kernels take the lane
// count as their template argument, not the vector type: a type's attributes do not survive being
// a template argument, and a vector aligned to its size would be loaded with aligned moves.)
template <int W>
struct VecOf;
template <>
struct VecOf<16> {
  typedef v16 type;
};
template <>
struct VecOf<8> {
  typedef v8 type;
};

// c (mr x nr, row stride ldc) (+)= a (mr x kc) * pb (kc x nr). Packed: a is a panel (kc x MR,
// element (i, k) at a[k * MR + i]); else row i of a starts at a + i * lda (rows past mr read row
// mr - 1's elements, never memory outside a). The tile is NV vectors V wide (nr <= its width):
// a whole NR-column panel in one tile of 16-float vectors (AVX-512: 24 of its 32 registers), in
// 16-column halves of 8-float ones (AVX2: 12 of 16). Each output sums over k in k order either way.
// bias (or null): nr values added to every row when the tile is stored, not added to (!add).
// ldb: floats from one k of pb to the next (NR: a packed panel; a row stride: B read in place).
template <int W, bool Packed, int R, int NV>
__attribute__((always_inline)) inline void micro_body(int64_t kc, const float *a, int64_t lda, const float *pb, float *c,
                                                      int64_t ldc, int mr, int nr, bool add, const float *bias,
                                                      int64_t ldb) {
  typedef typename VecOf<W>::type V;
  constexpr int COLS = NV * W;
  V acc[R][NV];
  const float *row[R];
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
    row[i] = a + (Packed ? i : std::min(i, mr - 1) * lda);
  }
  for (int64_t k = 0; k < kc; ++k) {
    V b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const V *>(pb + k * ldb + v * W);
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      float x = Packed ? row[0][k * MR + i] : row[i][k];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] += x * b[v];
    }
  }
  if (mr == R && nr == COLS) {
    if (bias && !add) {
      V bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = *reinterpret_cast<const V *>(bias + v * W);
      for (int i = 0; i < R; ++i)
        for (int v = 0; v < NV; ++v) acc[i][v] += bv[v];
    }
    for (int i = 0; i < R; ++i) {
      V *out = reinterpret_cast<V *>(c + i * ldc);
      for (int v = 0; v < NV; ++v) {
        if (add)
          out[v] += acc[i][v];
        else
          out[v] = acc[i][v];
      }
    }
    return;
  }
  if (!add) {  // (a row's vectors are its columns, in order)
    for (int i = 0; i < mr; ++i) memcpy(c + i * ldc, &acc[i][0], (size_t)nr * sizeof(float));
    if (bias)
      for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j) c[i * ldc + j] += bias[j];
    return;
  }
  float tile[R][COLS];
  memcpy(tile, acc, sizeof tile);
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) c[i * ldc + j] += tile[i][j];
}

// The AVX2 form of a tile of R rows (a multiple of 6) x nr <= NR columns: 6-row x 16-column
// pieces, each A row group read once per half.
template <bool Packed, int R>
__attribute__((always_inline)) inline void micro_avx2(int64_t kc, const float *a, int64_t lda, const float *pb,
                                                      float *c, int64_t ldc, int mr, int nr, bool add,
                                                      const float *bias, int64_t ldb) {
  for (int r = 0; r < R && r < mr; r += 6)
    for (int h = 0; h < nr; h += 16)
      micro_body<8, Packed, 6, 2>(kc, Packed ? a + r : a + r * lda, lda, pb + h, c + r * ldc + h, ldc,
                                   std::min(6, mr - r), std::min(16, nr - h), add, bias ? bias + h : nullptr, ldb);
}

// Each kernel below in its three forms, the host's picked per call (kernel_isa, isa.h).
// (the bodies: expressions in parentheses, the 16-float one also the portable form)
#define DYNAMO_KERNEL3(ret, name, params, args, avx512_body, avx2_body) \
  DYNAMO_TARGET_AVX512 ret name##_avx512 params { return avx512_body; } \
  DYNAMO_TARGET_AVX2 ret name##_avx2 params { return avx2_body; }       \
  ret name##_base params { return avx512_body; }                        \
  ret name params {                                                   \
    switch (kernel_isa()) {                                           \
      case Isa::Avx512: return name##_avx512 args;                    \
      case Isa::Avx2: return name##_avx2 args;                        \
      default: return name##_base args;                               \
    }                                                                 \
  }

DYNAMO_KERNEL3(void, micro_kernel,
               (int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc, int mr, int nr, bool add),
               (kc, pa, pb, c, ldc, mr, nr, add),
               (micro_body<16, true, MR, 2>(kc, pa, 0, pb, c, ldc, mr, nr, add, nullptr, NR)),
               (micro_avx2<true, MR>(kc, pa, 0, pb, c, ldc, mr, nr, add, nullptr, NR)))

// The packed-A kernel over 32 columns of B read in place (row k at b + k * ldb): B's full panels
// in products too small to repay packing it.
DYNAMO_KERNEL3(void, micro_kernel_b_rows,
               (int64_t kc, const float *pa, const float *b, int64_t ldb, float *c, int64_t ldc, int mr, bool add),
               (kc, pa, b, ldb, c, ldc, mr, add),
               (micro_body<16, true, MR, 2>(kc, pa, 0, b, c, ldc, mr, NR, add, nullptr, ldb)),
               (micro_avx2<true, MR>(kc, pa, 0, b, c, ldc, mr, NR, add, nullptr, ldb)))

DYNAMO_KERNEL3(void, micro_kernel_rows,
               (int64_t kc, const float *a, int64_t lda, const float *pb, float *c, int64_t ldc, int mr, int nr,
                bool add, const float *bias),
               (kc, a, lda, pb, c, ldc, mr, nr, add, bias),
               (micro_body<16, false, RR, 2>(kc, a, lda, pb, c, ldc, mr, nr, add, bias, NR)),
               (micro_avx2<false, RR>(kc, a, lda, pb, c, ldc, mr, nr, add, bias, NR)))

// The same for a last panel of at most 16 columns (half the multiplications).
DYNAMO_KERNEL3(void, micro_kernel_rows16,
               (int64_t kc, const float *a, int64_t lda, const float *pb, float *c, int64_t ldc, int mr, int nr,
                bool add, const float *bias),
               (kc, a, lda, pb, c, ldc, mr, nr, add, bias),
               (micro_body<16, false, RR, 1>(kc, a, lda, pb, c, ldc, mr, nr, add, bias, NR)),
               (micro_avx2<false, RR>(kc, a, lda, pb, c, ldc, mr, nr, add, bias, NR)))

// The C tile of the next micro-kernel call, rows x NR floats at stride ldc, asked for ahead (for
// writing): a product whose C is not in cache (a weight's gradient, written fresh each step) would
// otherwise wait for every line of it as the tile is stored.
inline void prefetch_tile(const float *c, int64_t ldc, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    __builtin_prefetch(c + r * ldc, 1, 3);
    __builtin_prefetch(c + r * ldc + 16, 1, 3);
  }
}

// B[k0 : k0 + kc, columns of panel p] into dst, kc x NR (zero-padded).
void pack_b_panel(const MatView &B, int64_t k0, int64_t kc, int64_t N, int64_t p, float *dst) {
  int64_t j0 = p * NR, nr = std::min<int64_t>(NR, N - j0);
  if (B.rs == 1 && B.cs != 1) {  // B's columns contiguous (a weight's transpose): read each one
    // along k, scatter into the panel (kc x NR, in cache); reading across the columns instead
    // would touch nr lines per k at one stride, often all in one cache set
    for (int64_t kb = 0; kb < kc; kb += 64) {  // (64 rows of the panel, 8 KB, written at a time)
      const int64_t ke = std::min<int64_t>(kc, kb + 64);
      for (int64_t j = 0; j < nr; ++j) {
        const float *src = B.data + k0 + (j0 + j) * B.cs;
        for (int64_t k = kb; k < ke; ++k) dst[k * NR + j] = src[k];
      }
    }
    for (int64_t k = 0; k < kc && nr < NR; ++k)
      for (int64_t j = nr; j < NR; ++j) dst[k * NR + j] = 0.0f;
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    const float *src = B.data + (k0 + k) * B.rs + j0 * B.cs;
    float *d = dst + k * NR;
    if (B.cs == 1) {
      memcpy(d, src, nr * sizeof(float));
    } else {
      for (int64_t j = 0; j < nr; ++j) d[j] = src[j * B.cs];
    }
    for (int64_t j = nr; j < NR; ++j) d[j] = 0.0f;
  }
}

// B[k0 : k0 + kc, all columns] into panels of NR columns (zero-padded), kc x NR each.
void pack_b_block(const MatView &B, int64_t k0, int64_t kc, int64_t N, float *out, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) pack_b_panel(B, k0, kc, N, p, out + p * kc * NR);
}

// A[i0 : i0 + mc, k0 : k0 + kc] into panels of MR rows (zero-padded), kc x MR each.
void pack_a(const MatView &A, int64_t i0, int64_t mc, int64_t k0, int64_t kc, float *out) {
  for (int64_t p = 0; p * MR < mc; ++p) {
    float *dst = out + p * kc * MR;
    int64_t r0 = i0 + p * MR, mr = std::min<int64_t>(MR, mc - p * MR);
    for (int64_t k = 0; k < kc; ++k) {
      const float *src = A.data + r0 * A.rs + (k0 + k) * A.cs;
      for (int64_t i = 0; i < mr; ++i) dst[k * MR + i] = src[i * A.rs];
      for (int64_t i = mr; i < MR; ++i) dst[k * MR + i] = 0.0f;
    }
  }
}

// sum over k of a[k] * b[k] in 32 lanes (lane l takes the k = l mod 32), lanes l and l + 16
// then added and those 16 sums added in order: the same sum on every level.
template <int W>
__attribute__((always_inline)) inline float dot_body(int64_t K, const float *a, const float *b) {
  typedef typename VecOf<W>::type V;
  constexpr int NA = 32 / W;
  V acc[NA];
#pragma GCC unroll 4
  for (int v = 0; v < NA; ++v) acc[v] = V{};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32)
#pragma GCC unroll 4
    for (int v = 0; v < NA; ++v)
      acc[v] += *reinterpret_cast<const V *>(a + k + v * W) * *reinterpret_cast<const V *>(b + k + v * W);
  float half[16];
#pragma GCC unroll 2
  for (int v = 0; v < NA / 2; ++v) {
    V t = acc[v] + acc[v + NA / 2];
    memcpy(half + v * W, &t, sizeof t);
  }
  float s = 0;
  for (int i = 0; i < 16; ++i) s += half[i];
  for (; k < K; ++k) s += a[k] * b[k];
  return s;
}

DYNAMO_KERNEL3(float, dot, (int64_t K, const float *a, const float *b), (K, a, b), (dot_body<16>(K, a, b)),
               (dot_body<8>(K, a, b)))

// y[0:n] += alpha * row[0:n].
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void axpy(int64_t n, float alpha, const float *row, float *y) {
  for (int64_t j = 0; j < n; ++j) y[j] += alpha * row[j];
}

// -- few rows against a linear layer's weight ---------------------------------------------
// out[i][j] = sum over k of x_i[k] * w_j[k] for 6 rows x_i and 4 rows w_j, all K long and
// contiguous: 24 accumulator vectors along K (one load of each x_i and w_j per 16-deep step), summed
// across lanes at the end. w is read straight from the weight, no packing; the next block's rows
// (next, or null) are prefetched meanwhile, so memory and arithmetic overlap.
__attribute__((always_inline)) inline void dot_tile_v16(int64_t K, const float *const *x, const float *const *w,
                                                        const float *const *next, float out[DR][DC]) {
  v16 acc[DR][DC];
#pragma GCC unroll 6
  for (int i = 0; i < DR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < DC; ++j) acc[i][j] = v16{};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    v16 w0 = *reinterpret_cast<const v16 *>(w[0] + k), w1 = *reinterpret_cast<const v16 *>(w[1] + k);
    v16 w2 = *reinterpret_cast<const v16 *>(w[2] + k), w3 = *reinterpret_cast<const v16 *>(w[3] + k);
    if (next) {
#pragma GCC unroll 4
      for (int j = 0; j < DC; ++j) __builtin_prefetch(next[j] + k, 0, 3);
    }
#pragma GCC unroll 6
    for (int i = 0; i < DR; ++i) {
      v16 xi = *reinterpret_cast<const v16 *>(x[i] + k);
      acc[i][0] += xi * w0;
      acc[i][1] += xi * w1;
      acc[i][2] += xi * w2;
      acc[i][3] += xi * w3;
    }
  }
  for (int i = 0; i < DR; ++i) {
    // the four accumulators' lanes summed by halves: [a b] then [a b c d] then within quarters
    const v16 &a = acc[i][0], &b = acc[i][1], &c = acc[i][2], &d = acc[i][3];
    v16 ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
             __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    v16 cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
             __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    v16 q = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
            __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    q += __builtin_shufflevector(q, q, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    q += __builtin_shufflevector(q, q, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    for (int j = 0; j < DC; ++j) {
      float sum = q[4 * j];
      for (int64_t t = k; t < K; ++t) sum += x[i][t] * w[j][t];
      out[i][j] = sum;
    }
  }
}

// The AVX2 form: the block's weight rows two at a time (12 accumulators of 8 lanes, x read from
// memory by the FMAs: 14 of the 16 registers), each sum's 8 lanes added by halves.
__attribute__((always_inline)) inline void dot_tile_v8(int64_t K, const float *const *x, const float *const *w,
                                                       const float *const *next, float out[DR][DC]) {
  for (int j0 = 0; j0 < DC; j0 += 2) {
    v8 acc[DR][2];
#pragma GCC unroll 6
    for (int i = 0; i < DR; ++i) acc[i][0] = acc[i][1] = v8{};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      if (next) {
        __builtin_prefetch(next[j0] + k, 0, 3);
        __builtin_prefetch(next[j0 + 1] + k, 0, 3);
      }
#pragma GCC unroll 2
      for (int h = 0; h < 16; h += 8) {
        v8 w0 = *reinterpret_cast<const v8 *>(w[j0] + k + h), w1 = *reinterpret_cast<const v8 *>(w[j0 + 1] + k + h);
#pragma GCC unroll 6
        for (int i = 0; i < DR; ++i) {
          v8 xi = *reinterpret_cast<const v8 *>(x[i] + k + h);
          acc[i][0] += xi * w0;
          acc[i][1] += xi * w1;
        }
      }
    }
    for (int i = 0; i < DR; ++i)
      for (int j = 0; j < 2; ++j) {
        const v8 &a = acc[i][j];
        float sum = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        for (int64_t t = k; t < K; ++t) sum += x[i][t] * w[j0 + j][t];
        out[i][j0 + j] = sum;
      }
  }
}

DYNAMO_KERNEL3(void, dot_tile,
               (int64_t K, const float *const *x, const float *const *w, const float *const *next, float out[DR][DC]),
               (K, x, w, next, out), (dot_tile_v16(K, x, w, next, out)), (dot_tile_v8(K, x, w, next, out)))

}  // namespace

bool sgemv(int64_t N, int64_t K, const float *x, MatView B, float *y, bool accumulate, const ParallelFor &par) {
  if (N == 0) return true;
  if (B.rs == 1) {  // column n of B is contiguous (a linear layer's weight row): one dot product each
    par(N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        float d = K ? dot(K, x, B.data + n * B.cs) : 0.0f;
        y[n] = accumulate ? y[n] + d : d;
      }
    });
    return true;
  }
  if (B.cs == 1) {
    // rows contiguous (x @ W, GPT-2's Conv1D): K cut into a fixed number of runs of rows, each
    // summed over whole rows into a partial y of its own, the partials then added in run order
    // (the same sums on any number of threads). A run of whole rows is one sequential stream
    // where the rows lie back to back; cutting the columns instead would have each thread read
    // pieces of every row, far apart, at a fraction of the bandwidth.
    const int64_t runs = std::clamp<int64_t>(K / 64, 1, kRowRuns);
    if (runs == 1 || (int64_t)runs * N > (int64_t)1 << 22) {
      par((N + 255) / 256, 1, [&](int64_t b0, int64_t b1) {  // (each thread its block of columns)
        int64_t j0 = b0 * 256, j1 = std::min(N, b1 * 256);
        if (!accumulate) std::fill(y + j0, y + j1, 0.0f);
        for (int64_t k = 0; k < K; ++k) axpy(j1 - j0, x[k], B.data + k * B.rs + j0, y + j0);
      });
      return true;
    }
    std::unique_ptr<float[]> part(new float[(size_t)(runs * N)]);
    par(runs, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float *yr = part.get() + r * N;
        std::fill(yr, yr + N, 0.0f);
        for (int64_t k = K * r / runs; k < K * (r + 1) / runs; ++k) axpy(N, x[k], B.data + k * B.rs, yr);
      }
    });
    if (!accumulate) std::fill(y, y + N, 0.0f);
    for (int64_t r = 0; r < runs; ++r) axpy(N, 1.0f, part.get() + r * N, y);
    return true;
  }
  return false;
}

namespace {

// Whether RR rows at a stride of ld floats crowd into few sets of a 64-set, 8-way L1 (more than 4
// of them in one set): read in place, each k step would evict lines the next steps need; written
// a tile at a time down the rows, every line a page away from the last.
bool crowded(int64_t ld) {
  int count[64] = {0};
  for (int64_t i = 0; i < RR; ++i)
    if (++count[(uint64_t)(i * ld * (int64_t)sizeof(float) / 64) % 64] > 4) return true;
  return false;
}

// A per-call float buffer left uninitialized (every element read is written first: packing
// writes its padding too): a std::vector's zero fill would be a serial pass over megabytes.
struct Scratch {
  std::unique_ptr<float[]> p;
  explicit Scratch(size_t n) : p(new float[std::max<size_t>(n, 1)]) {}
  float *data() const { return p.get(); }
};

// [0, n) handed out in runs from a shared counter, each an eighth of what is left (between least
// and most items): a thread slowed down (an interrupt, a colder cache, a neighbour on its core)
// takes less of the work, where a fixed split would leave the others waiting at the region's end.
// Every thread of a region loops on take() until it returns false.
class Runs {
 public:
  Runs(int64_t n, int64_t least, int64_t most) : n_(n), least_(least), most_(std::max(least, most)) {}
  bool take(int64_t &b, int64_t &e) {
    int64_t cur = next_.load(std::memory_order_relaxed);
    for (;;) {
      if (cur >= n_) return false;
      const int64_t len = std::min(n_ - cur, std::clamp((n_ - cur) / 8, least_, most_));
      if (next_.compare_exchange_weak(cur, cur + len, std::memory_order_relaxed)) {
        b = cur;
        e = cur + len;
        return true;
      }
    }
  }

 private:
  std::atomic<int64_t> next_{0};
  const int64_t n_, least_, most_;
};

// C (+)= A * B over rows i0 : i0 + mc (at most MC), B's K block (k0, kc) packed at bp: A's rows
// packed into ap (MR-row panels), then every panel of B against them, a panel's tiles down C's
// rows. once: this block is all of K, so C's lines are written once, cold (a weight's gradient,
// G^T X); where C's row stride crowds the cache (a multiple of 2 KB: every row in one set, every
// row a page away) the tiles go along C's rows instead, NC columns at a time, so that C is
// written in runs of lines (1024 x 1024 x 64 cold: 0.93 -> 0.72 ms).
void rows_times_block(int64_t i0, int64_t mc, int64_t N, MatView A, int64_t k0, int64_t kc, const float *bp, float *ap,
                      float *C, int64_t ldc, bool add, bool once) {
  pack_a(A, i0, mc, k0, kc, ap);
  if (once && crowded(ldc)) {
    for (int64_t j0 = 0; j0 < N; j0 += NC) {
      const int64_t j1 = std::min(N, j0 + NC);
      for (int64_t i = 0; i < mc; i += MR) {
        const int mr = (int)std::min<int64_t>(MR, mc - i);
        for (int64_t j = j0; j < j1; j += NR) {
          if (j + NR < j1) prefetch_tile(C + (i0 + i) * ldc + j + NR, ldc, mr);
          else if (i + MR < mc) prefetch_tile(C + (i0 + i + MR) * ldc + j0, ldc, std::min<int64_t>(MR, mc - i - MR));
          micro_kernel(kc, ap + (i / MR) * kc * MR, bp + (j / NR) * kc * NR, C + (i0 + i) * ldc + j, ldc, mr,
                       (int)std::min<int64_t>(NR, N - j), add);
        }
      }
    }
    return;
  }
  for (int64_t j = 0; j < N; j += NR) {
    const float *pb = bp + (j / NR) * kc * NR;
    const int nr = (int)std::min<int64_t>(NR, N - j);
    for (int64_t i = 0; i < mc; i += MR) {
      const int mr = (int)std::min<int64_t>(MR, mc - i);
      if (i + MR < mc) prefetch_tile(C + (i0 + i + MR) * ldc + j, ldc, std::min<int64_t>(MR, mc - i - MR));
      micro_kernel(kc, ap + (i / MR) * kc * MR, pb, C + (i0 + i) * ldc + j, ldc, mr, nr, add);
    }
  }
}

// C (+)= A * B with B's K block starting at k0 (kc deep) packed at block(k0, kc). The threads
// take C's rows in runs of whole MR-row panels (Runs: at most MC rows, at least 2 panels).
void sgemm_blocks(int64_t M, int64_t N, int64_t K, MatView A, float *C, int64_t ldc, bool accumulate,
                  const ParallelFor &par, const std::function<const float *(int64_t, int64_t)> &block) {
  const int64_t panels = (M + MR - 1) / MR;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0);
    const float *bp = block(k0, kc);
    const bool add = accumulate || k0 > 0;
    Runs runs(panels, 2, MC / MR);
    par(panels, 2, [&](int64_t, int64_t) {
      Scratch ap((size_t)(MC * kc));
      for (int64_t q0, q1; runs.take(q0, q1);) {
        const int64_t i0 = q0 * MR, i1 = std::min(M, q1 * MR);
        rows_times_block(i0, i1 - i0, N, A, k0, kc, bp, ap.data(), C, ldc, add, kc == K);
      }
    });
  }
}

// C (+)= A * B for at most MC rows: the threads take C's columns in runs of whole NR-column
// panels (Runs: 2 to 4), each thread having packed all of A (every K block) first, and a run its
// panels of B one K block at a time; one parallel region (a few rows split by rows would leave a
// thread idle for a panel's worth, and a B packed by all the threads would need a region per K
// block). A training step's input gradient G W.
void sgemm_columns(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
                   const ParallelFor &par) {
  constexpr int64_t kMost = 4;
  const int64_t npanels = (N + NR - 1) / NR, mp = (M + MR - 1) / MR * MR;  // (A's rows, padded)
  Runs runs(npanels, 2, kMost);
  par(npanels, 2, [&](int64_t, int64_t) {
    Scratch ap((size_t)(mp * K)), bp((size_t)(kMost * std::min(K, KC) * NR));
    for (int64_t k0 = 0; k0 < K; k0 += KC) pack_a(A, 0, M, k0, std::min(KC, K - k0), ap.data() + k0 * mp);
    for (int64_t p0, p1; runs.take(p0, p1);) {
      const int64_t j0 = p0 * NR, nc = std::min(N, p1 * NR) - j0;
      const MatView mine{B.data + j0 * B.cs, B.rs, B.cs};
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min(KC, K - k0);
        pack_b_block(mine, k0, kc, nc, bp.data(), 0, p1 - p0);
        for (int64_t j = 0; j < nc; j += NR) {
          const float *pb = bp.data() + (j / NR) * kc * NR;
          const int nr = (int)std::min<int64_t>(NR, nc - j);
          for (int64_t i = 0; i < M; i += MR) {
            const int mr = (int)std::min<int64_t>(MR, M - i);
            if (i + MR < M) prefetch_tile(C + (i + MR) * ldc + j0 + j, ldc, std::min<int64_t>(MR, M - i - MR));
            micro_kernel(kc, ap.data() + k0 * mp + (i / MR) * kc * MR, pb, C + i * ldc + j0 + j, ldc, mr, nr,
                         accumulate || k0 > 0);
          }
        }
      }
    }
  });
}

// C (+)= A * B for at most MC rows and one K block with B's rows contiguous, B read in place: its
// full panels straight from B, a last partial one packed (a product of few rows or a short K,
// where packing B is most of the work: a training step's weight gradient of a classifier head,
// G^T H as [10, 64] x [64, 1024], its input gradient G W as [64, 10] x [10, 1024]). Every thread
// packs all of A and takes column panels in runs.
void sgemm_b_in_place(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
                      const ParallelFor &par) {
  const int64_t npanels = (N + NR - 1) / NR, full = N / NR;
  Runs runs(npanels, 2, 8);
  par(npanels, 2, [&](int64_t, int64_t) {
    Scratch ap((size_t)((M + MR - 1) / MR * MR * K)), tail((size_t)(K * NR));
    pack_a(A, 0, M, 0, K, ap.data());
    for (int64_t p0, p1; runs.take(p0, p1);)
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t j = p * NR;
        if (p == full) pack_b_panel(B, 0, K, N, p, tail.data());
        for (int64_t i = 0; i < M; i += MR) {
          const int mr = (int)std::min<int64_t>(MR, M - i);
          if (p < full)
            micro_kernel_b_rows(K, ap.data() + i * K, B.data + j, B.rs, C + i * ldc + j, ldc, mr, accumulate);
          else
            micro_kernel(K, ap.data() + i * K, tail.data(), C + i * ldc + j, ldc, mr, (int)(N - j), accumulate);
        }
      }
  });
}

// The trivial shapes: nothing to do, or C = 0 (K == 0). True when handled.
bool trivial(int64_t M, int64_t N, int64_t K, float *C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return true;
  if (K != 0) return false;
  if (!accumulate)
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
  return true;
}

}  // namespace

bool sgemm_few_rows(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
                    const ParallelFor &par) {
  if ((A.cs != 1 && K > 1) || (B.rs != 1 && K > 1)) return false;
  if (trivial(M, N, K, C, ldc, accumulate)) return true;
  // blocks of DC columns (weight rows), dealt to the threads; each block meets every tile of DR rows
  par((N + DC - 1) / DC, 16, [&](int64_t b0, int64_t b1) {
    auto rows = [&](int64_t b, const float **w) {  // block b's columns of B (the last repeated)
      int64_t j0 = b * DC, nc = std::min<int64_t>(DC, N - j0);
      for (int j = 0; j < DC; ++j) w[j] = B.data + (j0 + std::min<int64_t>(j, nc - 1)) * B.cs;
    };
    for (int64_t b = b0; b < b1; ++b) {
      int64_t j0 = b * DC, nc = std::min<int64_t>(DC, N - j0);
      const float *w[DC], *next[DC];
      rows(b, w);
      if (b + 1 < b1) rows(b + 1, next);
      for (int64_t i0 = 0; i0 < M; i0 += DR) {
        int64_t mr = std::min<int64_t>(DR, M - i0);
        const float *x[DR];
        for (int i = 0; i < DR; ++i) x[i] = A.data + (i0 + std::min<int64_t>(i, mr - 1)) * A.rs;
        float out[DR][DC];
        dot_tile(K, x, w, b + 1 < b1 ? next : nullptr, out);
        for (int64_t i = 0; i < mr; ++i)
          for (int64_t j = 0; j < nc; ++j) {
            float &c = C[(i0 + i) * ldc + j0 + j];
            c = accumulate ? c + out[i][j] : out[i][j];
          }
      }
    }
  });
  return true;
}

void sgemm(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
           const ParallelFor &par) {
  if (trivial(M, N, K, C, ldc, accumulate)) return;
  const int64_t npanels = (N + NR - 1) / NR;
  if (M <= MC && K <= 16 * KC && npanels >= 2 * ((M + MR - 1) / MR)) {  // (A packed whole per thread)
    sgemm_columns(M, N, K, A, B, C, ldc, accumulate, par);
    return;
  }
  Scratch bp((size_t)(npanels * std::min(K, KC) * NR));
  sgemm_blocks(M, N, K, A, C, ldc, accumulate, par, [&](int64_t k0, int64_t kc) {
    par(npanels, 4, [&](int64_t p0, int64_t p1) { pack_b_block(B, k0, kc, N, bp.data(), p0, p1); });
    return bp.data();
  });
}

bool sgemm_small_b_in_place(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc,
                            bool accumulate, const ParallelFor &par) {
  if (B.cs != 1 || M > MC || K > KC || K == 0 || N == 0 || M == 0) return false;
  sgemm_b_in_place(M, N, K, A, B, C, ldc, accumulate, par);
  return true;
}

std::vector<float> pack_b(int64_t N, int64_t K, MatView B, const ParallelFor &par) {
  const int64_t npanels = (N + NR - 1) / NR;
  std::vector<float> packed((size_t)std::max<int64_t>(1, npanels * K * NR));
  for (int64_t k0 = 0; k0 < K; k0 += KC) {  // block k0 starts at k0 * npanels * NR
    const int64_t kc = std::min(KC, K - k0);
    float *base = packed.data() + k0 * npanels * NR;
    par(npanels, 4, [&](int64_t p0, int64_t p1) { pack_b_block(B, k0, kc, N, base, p0, p1); });
  }
  return packed;
}

namespace {

// Rows of A per chunk of the in-place driver: a chunk's K block (at most MCR x KC floats, 144 KB)
// stays in L2 while the thread's panels pass over it.
constexpr int64_t MCR = 12 * RR;

// C (+)= A * B (+ bias), B packed by pack_b, A's rows read in place (unit column stride): no packing of A
// and 24 accumulators per step (RR rows x 32 columns) where sgemm_blocks' packed 6-row panels have
// 12. The work is a grid of (chunk of MCR rows, panel of 32 columns) tasks, chunk-major, dealt to
// the threads in contiguous runs: a thread keeps its panels' K blocks in L1/L2 over its rows, and
// one parallel region covers every K block (the micro-kernel adds the blocks after the first).
void rows_driver(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *packed_b, float *C,
                 int64_t ldc, bool accumulate, const float *bias, const ParallelFor &par) {
  const int64_t npanels = (N + NR - 1) / NR;
  // chunks of whole RR-row tiles, as even as they can be (the threads take equal runs of tasks);
  // at most MCR rows, fewer when there are few panels to share out (at least 8 tasks)
  const int64_t tiles = (M + RR - 1) / RR;
  int64_t most = MCR / RR;
  if (npanels < 8) most = std::max<int64_t>(1, std::min(most, tiles * npanels / 8));
  const int64_t nchunks = (tiles + most - 1) / most, chunk = (tiles + nchunks - 1) / nchunks * RR;
  par(nchunks * npanels, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = (t / npanels) * chunk, i1 = std::min(M, i0 + chunk), p = t % npanels, j = p * NR;
      const int nr = (int)std::min<int64_t>(NR, N - j);
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min(KC, K - k0);
        const float *pb = packed_b + k0 * npanels * NR + p * kc * NR;
        for (int64_t i = i0; i < i1; i += RR) {
          if (i + RR < i1) prefetch_tile(C + (i + RR) * ldc + j, ldc, std::min<int64_t>(RR, i1 - i - RR));
          (nr <= 16 ? micro_kernel_rows16 : micro_kernel_rows)(kc, A + i * lda + k0, lda, pb, C + i * ldc + j, ldc,
                                                                (int)std::min<int64_t>(RR, i1 - i), nr,
                                                                accumulate || k0 > 0, bias ? bias + j : nullptr);
        }
      }
    }
  });
}

}  // namespace

void sgemm_prepacked(int64_t M, int64_t N, int64_t K, MatView A, const float *packed_b, float *C, int64_t ldc,
                     bool accumulate, const ParallelFor &par, const float *bias) {
  if (M == 0 || N == 0) return;
  if (bias && !accumulate && K > 0 && (A.cs == 1 || K == 1)) {
    rows_driver(M, N, K, A.data, A.rs, packed_b, C, ldc, false, bias, par);
    return;
  }
  if (bias && !accumulate) {  // (the other paths add into C: start it at the bias)
    for (int64_t i = 0; i < M; ++i) memcpy(C + i * ldc, bias, (size_t)N * sizeof(float));
    accumulate = true;
  }
  if (trivial(M, N, K, C, ldc, accumulate)) return;
  if (A.cs == 1 || K == 1) {
    rows_driver(M, N, K, A.data, A.rs, packed_b, C, ldc, accumulate, nullptr, par);
    return;
  }
  const int64_t npanels = (N + NR - 1) / NR;
  sgemm_blocks(M, N, K, A, C, ldc, accumulate, par,
               [&](int64_t k0, int64_t) { return packed_b + k0 * npanels * NR; });
}

// -- a few dozen rows against a big weight's transpose that changes between calls ---------------
// A training step's forward products at a batch of 64: X W^T. The weight changes every step, so a
// packing of it kept across calls is rebuilt on every call: a transposing pass over the weight
// that writes a copy as big. Here only X is packed, once, and shared by the threads; W is read
// once, in place (or a block of a tile at a time into a per-thread buffer where its row stride
// would crowd the cache), as the micro-kernel's A of C^T = W X^T. (The input gradient G W reads W
// row-major: packing it per call (sgemm) was as fast as reading it in panels, measured.)
namespace {

constexpr int64_t SKC = 512;  // K block of the small-M products

// Floats from one row of a copied tile to the next: the K block rounded up to whole vectors,
// plus one, so rows in a row do not share cache sets (a 4 KB row stride would put all 12 in one).
int64_t skewed(int64_t kc) { return (kc + 15) / 16 * 16 + 16; }

// C = X W^T with W's rows contiguous (B = W^T: B.rs == 1): computed as C^T = W X^T, W's rows
// the micro-kernel's in-place A (12 at a time, copied per K block), X^T packed into panels of 32
// of X's rows; each tile of C^T is kept over the K blocks and stored transposed.
void small_m_transposed(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc,
                        bool accumulate, const float *bias, const ParallelFor &par) {
  const int64_t npm = (M + NR - 1) / NR;  // panels of X^T
  Scratch xt((size_t)(npm * K * NR));
  const MatView at{A.data, A.cs, A.rs};  // X^T as a K x M matrix
  const int64_t kblocks = (K + SKC - 1) / SKC;
  par(kblocks * npm, 1, [&](int64_t t0, int64_t t1) {  // (K block, panel) pairs
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t k0 = t / npm * SKC, kc = std::min(SKC, K - k0);
      pack_b_block(at, k0, kc, M, xt.data() + k0 * npm * NR, t % npm, t % npm + 1);
    }
  });
  const int64_t tiles = (N + RR - 1) / RR;
  const bool copy = crowded(B.cs);  // W's rows read in place unless their stride crowds the cache
  par(tiles, 1, [&](int64_t t0, int64_t t1) {
    Scratch abuf(copy ? (size_t)(RR * skewed(SKC)) : 0), acc((size_t)(npm * RR * NR));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = t * RR;
      const int mr = (int)std::min<int64_t>(RR, N - i0);
      for (int64_t k0 = 0; k0 < K; k0 += SKC) {
        const int64_t kc = std::min(SKC, K - k0), lda = copy ? skewed(kc) : B.cs;
        const float *a = B.data + k0 + i0 * B.cs;
        {  // the next K block of these rows, or the next tile's first, asked for while this one runs
          const int64_t nk = k0 + SKC < K ? k0 + SKC : 0, ni = nk ? i0 : i0 + RR;
          const int64_t nrows = std::min<int64_t>(RR, N - ni), nkc = std::min(SKC, K - nk);
          if (ni < N && (t + 1 < t1 || nk))
            for (int64_t i = 0; i < nrows; ++i)
              for (int64_t k = 0; k < nkc; k += 16) __builtin_prefetch(B.data + nk + k + (ni + i) * B.cs, 0, 2);
        }
        if (copy) {
          for (int i = 0; i < mr; ++i) memcpy(abuf.data() + i * lda, a + i * B.cs, kc * sizeof(float));
          a = abuf.data();
        }
        for (int64_t p = 0; p < npm; ++p) {
          const int nr = (int)std::min<int64_t>(NR, M - p * NR);
          (nr <= 16 ? micro_kernel_rows16 : micro_kernel_rows)(kc, a, lda, xt.data() + k0 * npm * NR + p * kc * NR,
                                                                acc.data() + p * RR * NR, NR, mr, nr, k0 > 0, nullptr);
        }
      }
      for (int64_t p = 0; p < npm; ++p) {  // tile (i, j) of C^T is C[p * NR + j][i0 + i]
        const int64_t nr = std::min<int64_t>(NR, M - p * NR);
        const float *tile = acc.data() + p * RR * NR;
        for (int64_t j = 0; j < nr; ++j) {
          float *row = C + (p * NR + j) * ldc + i0;
          for (int i = 0; i < mr; ++i) {
            float v = tile[i * NR + j];
            if (accumulate) row[i] += v;
            else row[i] = bias ? v + bias[i0 + i] : v;
          }
        }
      }
    }
  });
}

}  // namespace

bool sgemm_small_m(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
                   const float *bias, const ParallelFor &par) {
  if (M == 0 || N == 0) return true;
  if (K == 0 || B.rs != 1) return false;
  small_m_transposed(M, N, K, A, B, C, ldc, accumulate, accumulate ? nullptr : bias, par);
  return true;
}

void sgemm_prepacked_rows(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *packed_b,
                          float *C, int64_t ldc) {
  if (trivial(M, N, K, C, ldc, false)) return;
  const int64_t npanels = (N + NR - 1) / NR;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0);
    const float *bp = packed_b + k0 * npanels * NR;
    for (int64_t j = 0; j < N; j += NR) {
      const float *pb = bp + (j / NR) * kc * NR;
      const int nr = (int)std::min<int64_t>(NR, N - j);
      for (int64_t i = 0; i < M; i += RR)
        (nr <= 16 ? micro_kernel_rows16 : micro_kernel_rows)(kc, A + i * lda + k0, lda, pb, C + i * ldc + j, ldc,
                                                              (int)std::min<int64_t>(RR, M - i), nr, k0 > 0, nullptr);
    }
  }
}

}  // namespace dynamo::runtime
