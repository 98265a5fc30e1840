// winograd.cpp -- F(2, 3) Winograd convolutions, channels-last (see winograd.h).
//
// Along a dim of kernel 3 (padding 1), an output tile of 2 reads an input tile of 4:
//   input  v = B^T d:  v0 = d0 - d2, v1 = d1 + d2, v2 = d2 - d1, v3 = d1 - d3
//   weight u = G g:    u0 = g0, u1 = (g0 + g1 + g2) / 2, u2 = (g0 - g1 + g2) / 2, u3 = g2
//   output y = A^T m:  y0 = m0 + m1 + m2, y1 = m1 - m2 - m3      (m = u * v, elementwise)
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015); a dim of kernel
// 1 is a tile of 1 with no transform. The element-wise products summed over input channels are
// one GEMM per position p of the transformed tile: M[p] (tiles x Cout) = V[p] (tiles x Cin) *
// U[p] (Cin x Cout), U packed once per weight by pack_b and multiplied by sgemm_prepacked_rows
// (V read in place).
//
// Work goes in blocks of tiles sized so that a block's V and M stay in the core's L2 cache:
// each thread transforms a block's inputs, runs its GEMMs and transforms their results into the
// output, one block after another (no pass over memory-sized intermediates). Channels are
// innermost in every array, so each transform works on 16 channels at a time (one AVX-512
// vector; the kernels are built for three ISA levels like gemm.cpp's).
#include "winograd.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace dynamo::runtime {

namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));
constexpr int kLanes = 16;

// The first cnt (< 16) lanes, into or out of a vector (a row's last channels).
inline void load_part(v16 *v, const float *p, int64_t cnt) {
  *v = v16{};
  memcpy(v, p, (size_t)cnt * sizeof(float));
}

inline void store_part(float *p, const v16 *v, int64_t cnt) { memcpy(p, v, (size_t)cnt * sizeof(float)); }

struct Dims {
  int64_t a[3], st[3];  // tile extent per dim (4 or 1) and its stride in a tile's array
  int64_t m[3];         // output tile per dim (2 or 1)
  int64_t tiles[3];     // tiles per image per dim
  int64_t pad[3];
  explicit Dims(const WinogradShape &s) {
    for (int d = 0; d < 3; ++d) {
      a[d] = s.k[d] == 3 ? 4 : 1;
      m[d] = s.k[d] == 3 ? 2 : 1;
      pad[d] = s.k[d] == 3 ? 1 : 0;
      tiles[d] = (s.in[d] + m[d] - 1) / m[d];
    }
    st[2] = 1;
    st[1] = a[2];
    st[0] = a[1] * a[2];
  }
};

// The extents of a tile's array per dim (4 along a kernel dim of 3, else 1), known at compile
// time: the transforms' loops unroll, and a 2-D tile (16 vectors) stays in registers.
template <int A0, int A1, int A2>
struct Ext {
  static constexpr int a[3] = {A0, A1, A2};
  static constexpr int st[3] = {A1 * A2, A2, 1};  // strides in the array
  static constexpr int m[3] = {A0 == 4 ? 2 : 1, A1 == 4 ? 2 : 1, A2 == 4 ? 2 : 1};
  static constexpr int P = A0 * A1 * A2;
};

// The tile's array b transformed along dim d: v = B^T d.
template <class E, int d>
__attribute__((always_inline)) inline void input_transform(v16 *b) {
  if constexpr (E::a[d] == 4) {
    constexpr int o1 = d == 0 ? 1 : 0, o2 = d == 2 ? 1 : 2, s = E::st[d];  // (o1, o2: the other dims)
    for (int i = 0; i < E::a[o1]; ++i)
      for (int j = 0; j < E::a[o2]; ++j) {
        v16 *x = b + i * E::st[o1] + j * E::st[o2];
        v16 d0 = x[0], d1 = x[s], d2 = x[2 * s], d3 = x[3 * s];
        x[0] = d0 - d2;
        x[s] = d1 + d2;
        x[2 * s] = d2 - d1;
        x[3 * s] = d1 - d3;
      }
  }
}

// Image, and first input coordinate per dim, of tile `t` (over the whole batch).
inline int64_t tile_origin(const Dims &D, int64_t t, int64_t o[3]) {
  int64_t t2 = t % D.tiles[2], r = t / D.tiles[2];
  int64_t t1 = r % D.tiles[1];
  r /= D.tiles[1];
  int64_t t0 = r % D.tiles[0];
  o[0] = t0 * D.m[0];
  o[1] = t1 * D.m[1];
  o[2] = t2 * D.m[2];
  return r / D.tiles[0];
}

// V[p][tile - t0][c] for the block's tiles [t0, t1). The transform along dim 0 is done as the
// input is loaded, the one along dim 1 as V is stored (one pass over the tile's array, not three).
template <class E>
__attribute__((always_inline)) inline void inputs_body(const WinogradShape &s, const Dims &D, const float *x,
                                                       int64_t t0, int64_t t1, float *V, int64_t tb) {
  constexpr int A0 = E::a[0], A1 = E::a[1], A2 = E::a[2], S0 = E::st[0], S1 = E::st[1];
  const int64_t C = s.cin;
  v16 b[E::P];
  for (int64_t t = t0; t < t1; ++t) {
    int64_t o[3];
    const int64_t img = tile_origin(D, t, o);
    for (int d = 0; d < 3; ++d) o[d] -= D.pad[d];
    const float *xi = x + img * s.in[0] * s.in[1] * s.in[2] * C;
    for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
      const int64_t cnt = std::min<int64_t>(kLanes, C - c0);
      for (int i1 = 0; i1 < A1; ++i1)
        for (int i2 = 0; i2 < A2; ++i2) {
          const int64_t yy = o[1] + i1, w = o[2] + i2;
          const bool row = yy >= 0 && yy < s.in[1] && w >= 0 && w < s.in[2];
          v16 d[A0];
          for (int i0 = 0; i0 < A0; ++i0) {
            const int64_t z = o[0] + i0;
            d[i0] = v16{};
            if (!row || z < 0 || z >= s.in[0]) continue;
            const float *src = xi + ((z * s.in[1] + yy) * s.in[2] + w) * C + c0;
            if (cnt == kLanes) memcpy(&d[i0], src, sizeof(v16));
            else load_part(&d[i0], src, cnt);
          }
          v16 *e = b + i1 * S1 + i2;
          if constexpr (A0 == 4) {
            e[0] = d[0] - d[2];
            e[S0] = d[1] + d[2];
            e[2 * S0] = d[2] - d[1];
            e[3 * S0] = d[1] - d[3];
          } else {
            e[0] = d[0];
          }
        }
      input_transform<E, 2>(b);
      float *v = V + (t - t0) * C + c0;
      for (int i0 = 0; i0 < A0; ++i0)
        for (int i2 = 0; i2 < A2; ++i2) {
          const v16 *e = b + i0 * S0 + i2;
          v16 r[A1];
          if constexpr (A1 == 4) {
            r[0] = e[0] - e[2 * S1];
            r[1] = e[S1] + e[2 * S1];
            r[2] = e[2 * S1] - e[S1];
            r[3] = e[S1] - e[3 * S1];
          } else {
            r[0] = e[0];
          }
          for (int i1 = 0; i1 < A1; ++i1) {
            float *dst = v + (i0 * S0 + i1 * S1 + i2) * tb * C;
            if (cnt == kLanes) memcpy(dst, &r[i1], sizeof(v16));
            else store_part(dst, &r[i1], cnt);
          }
        }
    }
  }
}

// The block's outputs from M[p][tile - t0][c], plus bias. The transform along dim 2 is done as
// M is loaded, the one along dim 0 as the output is stored.
template <class E>
__attribute__((always_inline)) inline void outputs_body(const WinogradShape &s, const Dims &D, const float *M,
                                                        int64_t t0, int64_t t1, int64_t tb, const float *bias,
                                                        float *y) {
  constexpr int A0 = E::a[0], A1 = E::a[1], A2 = E::a[2], S0 = E::st[0], S1 = E::st[1];
  constexpr int M0 = E::m[0], M1 = E::m[1], M2 = E::m[2];
  const int64_t C = s.cout;
  v16 b[E::P];
  for (int64_t t = t0; t < t1; ++t) {
    int64_t o[3];
    const int64_t img = tile_origin(D, t, o);
    float *yi = y + img * s.in[0] * s.in[1] * s.in[2] * C;
    for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
      const int64_t cnt = std::min<int64_t>(kLanes, C - c0);
      const float *m = M + (t - t0) * C + c0;
      for (int i0 = 0; i0 < A0; ++i0)
        for (int i1 = 0; i1 < A1; ++i1) {
          v16 q[A2];
          for (int i2 = 0; i2 < A2; ++i2) {
            const float *src = m + (i0 * S0 + i1 * S1 + i2) * tb * C;
            if (cnt == kLanes) memcpy(&q[i2], src, sizeof(v16));
            else load_part(&q[i2], src, cnt);
          }
          v16 *e = b + i0 * S0 + i1 * S1;
          if constexpr (A2 == 4) {
            e[0] = q[0] + q[1] + q[2];
            e[1] = q[1] - q[2] - q[3];
          } else {
            e[0] = q[0];
          }
        }
      if constexpr (A1 == 4)  // along dim 1, over the M2 results of dim 2
        for (int i0 = 0; i0 < A0; ++i0)
          for (int j2 = 0; j2 < M2; ++j2) {
            v16 *e = b + i0 * S0 + j2;
            v16 m0 = e[0], m1 = e[S1], m2 = e[2 * S1], m3 = e[3 * S1];
            e[0] = m0 + m1 + m2;
            e[S1] = m1 - m2 - m3;
          }
      v16 bv{};
      if (bias) load_part(&bv, bias + c0, cnt);
      for (int j1 = 0; j1 < M1; ++j1)
        for (int j2 = 0; j2 < M2; ++j2) {
          const v16 *e = b + j1 * S1 + j2;
          v16 r[M0];
          if constexpr (A0 == 4) {
            r[0] = e[0] + e[S0] + e[2 * S0] + bv;
            r[M0 - 1] = e[S0] - e[2 * S0] - e[3 * S0] + bv;
          } else {
            r[0] = e[0] + bv;
          }
          if (o[1] + j1 >= s.in[1] || o[2] + j2 >= s.in[2]) continue;
          for (int j0 = 0; j0 < M0 && o[0] + j0 < s.in[0]; ++j0) {
            float *dst = yi + (((o[0] + j0) * s.in[1] + o[1] + j1) * s.in[2] + o[2] + j2) * C + c0;
            if (cnt == kLanes) memcpy(dst, &r[j0], sizeof(v16));
            else store_part(dst, &r[j0], cnt);
          }
        }
    }
  }
}

using InputsFn = void (*)(const WinogradShape &, const Dims &, const float *, int64_t, int64_t, float *, int64_t);
using OutputsFn = void (*)(const WinogradShape &, const Dims &, const float *, int64_t, int64_t, int64_t,
                           const float *, float *);

// Per tile shape (the dims of kernel 3), the transforms built for three ISA levels like gemm.cpp's.
#define DYNAMO_WINOGRAD_TRANSFORMS(A0, A1, A2)                                                                     \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void inputs_##A0##A1##A2(          \
      const WinogradShape &s, const Dims &D, const float *x, int64_t t0, int64_t t1, float *V, int64_t tb) {       \
    inputs_body<Ext<A0, A1, A2>>(s, D, x, t0, t1, V, tb);                                                           \
  }                                                                                                                \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void outputs_##A0##A1##A2(         \
      const WinogradShape &s, const Dims &D, const float *M, int64_t t0, int64_t t1, int64_t tb, const float *bias, \
      float *y) {                                                                                                  \
    outputs_body<Ext<A0, A1, A2>>(s, D, M, t0, t1, tb, bias, y);                                                    \
  }
DYNAMO_WINOGRAD_TRANSFORMS(4, 4, 4)
DYNAMO_WINOGRAD_TRANSFORMS(1, 4, 4)
DYNAMO_WINOGRAD_TRANSFORMS(4, 1, 4)
DYNAMO_WINOGRAD_TRANSFORMS(4, 4, 1)
#undef DYNAMO_WINOGRAD_TRANSFORMS

void transforms_for(const Dims &D, InputsFn *in, OutputsFn *out) {
  const int key = (D.a[0] == 4) * 4 + (D.a[1] == 4) * 2 + (D.a[2] == 4);
  switch (key) {
    case 7: *in = inputs_444; *out = outputs_444; break;
    case 3: *in = inputs_144; *out = outputs_144; break;
    case 5: *in = inputs_414; *out = outputs_414; break;
    default: *in = inputs_441; *out = outputs_441; break;  // (6: winograd_refusal admits no other)
  }
}

// Tiles per block: the block's V and M (P x tiles x channels each) within ~0.5 MB (the
// transformed weights then stay in L2 beside them: 12 tiles a block took r3d_18's 64-channel
// convolution 3.5-3.7 ms, 24 tiles 3.7-4.2 ms), a multiple of 12 (the micro-kernel's rows) from
// 12 to 96.
int64_t block_tiles(const WinogradShape &s, int64_t P) {
  int64_t per_tile = P * (s.cin + s.cout);
  return std::clamp<int64_t>((int64_t(1) << 17) / std::max<int64_t>(1, per_tile), 12, 96) / 12 * 12;
}

constexpr int64_t kMinTiles = 64;
constexpr int64_t kMaxWeightBytes = int64_t(4) << 20;

}  // namespace

int64_t WinogradShape::positions() const {
  int64_t p = 1;
  for (int d = 0; d < 3; ++d) p *= k[d] == 3 ? 4 : 1;
  return p;
}

std::string winograd_refusal(const std::vector<int64_t> &x_sizes, const std::vector<int64_t> &w_sizes,
                             const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                             const std::vector<int64_t> &dilation, int64_t groups, WinogradShape *shape) {
  if (x_sizes.size() < 3 || x_sizes.size() > 5 || w_sizes.size() != x_sizes.size())
    return "not a 1-3 dimensional convolution";
  const size_t sd = x_sizes.size() - 2;
  if (groups != 1) return "a grouped convolution";
  if (stride.size() != sd || padding.size() != sd || dilation.size() != sd)
    return "stride, padding or dilation of another rank";
  WinogradShape s;
  s.n = x_sizes[0];
  s.cin = x_sizes[1];
  s.cout = w_sizes[0];
  if (w_sizes[1] != s.cin) return "channel mismatch";
  int threes = 0;
  for (size_t k = 0; k < sd; ++k) {
    const size_t d = 3 - sd + k;
    s.in[d] = x_sizes[2 + k];
    s.k[d] = w_sizes[2 + k];
    if (stride[k] != 1 || dilation[k] != 1) return "a strided or dilated convolution";
    if (s.k[d] == 3 && padding[k] == 1) ++threes;
    else if (s.k[d] != 1 || padding[k] != 0) return "a kernel dim other than 3 (padding 1) or 1 (padding 0)";
  }
  if (threes < 2) return "fewer than two kernel dims of 3";
  if (s.n < 1 || s.cin < 1 || s.cout < 1 || s.in[0] < 1 || s.in[1] < 1 || s.in[2] < 1) return "an empty tensor";
  // Each block of tiles reads all the transformed weights (P / 27 times the kernel's size for
  // 3x3x3): with few tiles, or weights far larger than a core's L2 cache, the products wait on
  // memory (r3d_18's 256 channels at 2x8x8: 3.4 ms against the direct kernel's 1.1).
  int64_t tiles = s.n;
  for (int d = 0; d < 3; ++d) tiles *= s.k[d] == 3 ? (s.in[d] + 1) / 2 : s.in[d];
  if (tiles < kMinTiles) return "fewer than " + std::to_string(kMinTiles) + " output tiles";
  if (s.positions() * s.cin * s.cout * (int64_t)sizeof(float) > kMaxWeightBytes)
    return "transformed weights over " + std::to_string(kMaxWeightBytes >> 20) + " MB";
  *shape = s;
  return "";
}

std::vector<std::vector<float>> winograd_weights(const WinogradShape &s, const float *w, const ParallelFor &par) {
  const Dims D(s);
  const int64_t P = s.positions(), kn = s.k[0] * s.k[1] * s.k[2];
  // U[p][ci][co] in double (exact halves; one rounding at the end), then packed per position.
  std::vector<float> U((size_t)(P * s.cin * s.cout));
  par(s.cout, 4, [&](int64_t co0, int64_t co1) {
    for (int64_t co = co0; co < co1; ++co)
      for (int64_t ci = 0; ci < s.cin; ++ci) {
        const float *g = w + (co * s.cin + ci) * kn;
        double b[64] = {};
        for (int64_t i0 = 0; i0 < s.k[0]; ++i0)
          for (int64_t i1 = 0; i1 < s.k[1]; ++i1)
            for (int64_t i2 = 0; i2 < s.k[2]; ++i2)
              b[i0 * D.st[0] + i1 * D.st[1] + i2] = g[(i0 * s.k[1] + i1) * s.k[2] + i2];
        for (int d = 2; d >= 0; --d) {  // G along each dim of 3: values 0..2 -> 0..3
          if (D.a[d] != 4) continue;
          const int o1 = d == 0 ? 1 : 0, o2 = d == 2 ? 1 : 2;
          const int64_t st = D.st[d];
          for (int64_t i = 0; i < D.a[o1]; ++i)
            for (int64_t j = 0; j < D.a[o2]; ++j) {
              double *x = b + i * D.st[o1] + j * D.st[o2];
              double g0 = x[0], g1 = x[st], g2 = x[2 * st];
              x[0] = g0;
              x[st] = (g0 + g1 + g2) / 2;
              x[2 * st] = (g0 - g1 + g2) / 2;
              x[3 * st] = g2;
            }
        }
        for (int64_t p = 0; p < P; ++p) U[(size_t)((p * s.cin + ci) * s.cout + co)] = (float)b[p];
      }
  });
  std::vector<std::vector<float>> packed((size_t)P);
  for (int64_t p = 0; p < P; ++p)
    packed[(size_t)p] = pack_b(s.cout, s.cin, MatView{U.data() + p * s.cin * s.cout, s.cout, 1}, par);
  return packed;
}

void winograd_conv(const WinogradShape &s, const float *x, const std::vector<std::vector<float>> &u,
                   const float *bias, float *y) {
  const Dims D(s);
  const int64_t P = s.positions();
  const int64_t tiles = s.n * D.tiles[0] * D.tiles[1] * D.tiles[2];
  const int64_t tb = block_tiles(s, P), blocks = (tiles + tb - 1) / tb;
  InputsFn in;
  OutputsFn out;
  transforms_for(D, &in, &out);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> V, M;
    V.resize((size_t)(P * tb * s.cin));
    M.resize((size_t)(P * tb * s.cout));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t t0 = blk * tb, t1 = std::min(tiles, t0 + tb), rows = t1 - t0;
      in(s, D, x, t0, t1, V.data(), tb);
      for (int64_t p = 0; p < P; ++p)
        sgemm_prepacked_rows(rows, s.cout, s.cin, V.data() + p * tb * s.cin, s.cin, u[(size_t)p].data(),
                             M.data() + p * tb * s.cout, s.cout);
      out(s, D, M.data(), t0, t1, tb, bias, y);
    }
  });
}

}  // namespace dynamo::runtime
