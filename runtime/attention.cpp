// attention.cpp -- dynamo::attention, the fused attention kernel traces run for
// scaled_dot_product_attention (and nn.MultiheadAttention's decomposed fast path): per query block,
// the scores of one block of keys at a time, an online softmax (running row max and sum, the
// accumulated output rescaled when the max grows), and the probabilities times the values, so the
// L x S score matrix never exists in memory. Same math as ATen's CPU flash attention
// (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp); results differ by rounding only.
//
// Layout: K is packed once per call as K^T per (batch, head) (head size x keys, keys padded to
// the block), V as keys x head size (padded to the block), both zero-padded; each query tile is
// copied with the scale folded in. The score tile (QB rows x KB keys) is a register-blocked
// product like runtime/gemm.cpp's micro-kernel; a work item is TILES tiles (24 queries), which
// take each key block in turn while its K^T and V rows are in the L1 cache. exp is a vectorized
// polynomial (|rel err| < 2e-7 on the range softmax uses). Compiled for AVX-512, AVX2 and the
// baseline (target_clones).
// (vexp is always inlined into the target_clones bodies: the AVX-512 vector ABI note does not apply)
#pragma GCC diagnostic ignored "-Wpsabi"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int QB = 6;    // query rows per block (the score tile's rows)
constexpr int KB = 64;   // keys per block (the score tile's columns: KV 16-float vectors)
constexpr int KV = KB / 16;
constexpr int DB = 32;   // output columns per register tile of the P x V product
constexpr int TILES = 4; // query tiles that share each key block (while it is in the L1 cache)
constexpr int64_t kMaxHead = 512;

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4)));

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// exp(x) on 16 floats: x = n ln2 + r, |r| <= ln2/2, exp(r) by its degree-6 Taylor polynomial,
// 2^n through the exponent bits. -inf (a masked score) gives 0; x below -87 underflows to 0.
// n = round(x / ln2) by the 1.5 * 2^23 trick: adding it rounds to an integer in the low bits of
// the sum (|t| <= 126 here), which are n's bits plus the constant's.
__attribute__((always_inline)) inline v16 vexp(v16 x) {
  const v16i under = x < -87.0f;  // -1 where the result underflows (and at -inf): 0 there
  v16 t = x * 1.44269504088896341f;
  t = t < -126.0f ? v16{} - 126.0f : t;
  t = t > 126.0f ? v16{} + 126.0f : t;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  const v16 shifted = t + kShift;
  const v16 nf = shifted - kShift;
  v16i ni;
  memcpy(&ni, &shifted, sizeof ni);
  ni -= 0x4B400000;  // kShift's bits: ni is n
  const v16 r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
  v16 p = v16{} + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const v16i bits = (ni + 127) << 23;
  v16 two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  v16 y = p * two_n;
  v16i ybits;
  memcpy(&ybits, &y, sizeof y);
  ybits &= ~under;
  memcpy(&y, &ybits, sizeof y);
  return y;
}

// The 16 lanes combined as a tree (4 dependent steps, not a chain of 15): sum, max.
__attribute__((always_inline)) inline v16 fold_halves(v16 x, bool max) {
  v16 y = __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  x = max ? (x > y ? x : y) : x + y;
  y = __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  x = max ? (x > y ? x : y) : x + y;
  y = __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  x = max ? (x > y ? x : y) : x + y;
  y = __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return max ? (x > y ? x : y) : x + y;
}
__attribute__((always_inline)) inline float hsum(v16 x) { return fold_halves(x, false)[0]; }
__attribute__((always_inline)) inline float hmax(v16 x) { return fold_halves(x, true)[0]; }

struct Problem {
  int64_t B, H, L, S, D;            // batch, heads, queries, keys, head size (of q, k and v)
  int64_t Hk, G;                    // key/value heads, and query heads per key/value head (grouped: H = Hk * G)
  const float *q, *k, *v;
  int64_t qs[4], ks[4], vs[4], os[4];  // element strides of q, k, v, out ([B, H, rows, D])
  float *out, *lse;                 // lse: [B, H, L] contiguous
  float scale;
  bool causal;
  int64_t Sp, Dp;                   // keys padded to KB, head size padded to DB
  const float *kt, *vp;             // packed: per (b, key/value head) K^T [D, Sp], and V [Sp, Dp] unless v_direct
  bool v_direct;                    // V read in place (rows of unit stride, D a multiple of DB)
};

// K^T (and V unless it is read in place) of key/value head bh (b * Hk + h) into the packed
// buffers (zero-padded).
void pack_head(const Problem &p, int64_t bh, float *kt, float *vp) {
  int64_t b = bh / p.Hk, h = bh % p.Hk;
  const float *k = p.k + b * p.ks[0] + h * p.ks[1];
  const float *v = p.v + b * p.vs[0] + h * p.vs[1];
  for (int64_t j0 = 0; j0 < p.S; j0 += 16)  // 16 keys at a time: their rows read once, in order
    for (int64_t d = 0; d < p.D; ++d) {
      float *row = kt + d * p.Sp;
      for (int64_t j = j0; j < std::min<int64_t>(p.S, j0 + 16); ++j) row[j] = k[j * p.ks[2] + d * p.ks[3]];
    }
  for (int64_t d = 0; d < p.D; ++d) std::fill(kt + d * p.Sp + p.S, kt + (d + 1) * p.Sp, 0.0f);
  if (p.v_direct) return;
  for (int64_t j = 0; j < p.Sp; ++j) {
    float *row = vp + j * p.Dp;
    if (j < p.S) {
      for (int64_t d = 0; d < p.D; ++d) row[d] = v[j * p.vs[2] + d * p.vs[3]];
      std::fill(row + p.D, row + p.Dp, 0.0f);
    } else {
      std::fill(row, row + p.Dp, 0.0f);
    }
  }
}

// The running state of one tile of up to QB query rows: the queries times the scale, d-major
// (q[d * QB + r]), the output accumulators (rescaled as a row's max grows), row max and sum.
struct Tile {
  int64_t i0;
  int rows;
  float q[kMaxHead * QB];
  alignas(64) float acc[QB][kMaxHead];
  float m[QB], l[QB];
};

// Key block [j0, j0 + KB) into tile t: its scores (a QB x KB register tile), the online softmax
// update, and acc += P x V of the block.
__attribute__((always_inline)) inline void tile_step(const Problem &p, Tile &t, const float *kt, const float *vp,
                                                    int64_t vrs, int64_t j0, int64_t keys) {
  v16 s[QB][KV];
#pragma GCC unroll 6
  for (int r = 0; r < QB; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < KV; ++u) s[r][u] = v16{};
  for (int64_t d = 0; d < p.D; ++d) {
    v16 k[KV];
#pragma GCC unroll 4
    for (int u = 0; u < KV; ++u) memcpy(&k[u], kt + d * p.Sp + j0 + 16 * u, sizeof(v16));
#pragma GCC unroll 6
    for (int r = 0; r < QB; ++r) {
      float a = t.q[d * QB + r];
#pragma GCC unroll 4
      for (int u = 0; u < KV; ++u) s[r][u] += a * k[u];
    }
  }
  alignas(64) float pr[QB][KB];  // the block's probabilities (unnormalized)
  for (int r = 0; r < t.rows; ++r) {
    float *sr = pr[r];
    memcpy(sr, s[r], sizeof s[r]);
    int64_t last = p.causal ? std::min<int64_t>(p.S, t.i0 + r + 1) : p.S;  // keys [j0, last) count
    if (j0 + KB > last)  // the last block, or the causal diagonal: keys past `last` are masked
      for (int64_t c = std::max<int64_t>(0, last - j0); c < KB; ++c) sr[c] = -std::numeric_limits<float>::infinity();
    v16 x[KV];
    memcpy(x, sr, sizeof x);
    v16 top = x[0];
#pragma GCC unroll 4
    for (int u = 1; u < KV; ++u) top = top > x[u] ? top : x[u];
    float mx = std::max(t.m[r], hmax(top));
    if (mx == -std::numeric_limits<float>::infinity()) {  // every key masked so far (causal, later tile)
      std::fill(sr, sr + KB, 0.0f);
      continue;
    }
    float corr = mx == t.m[r] ? 1.0f : std::exp(t.m[r] - mx);  // exp(-inf) = 0 on the first keys
    v16 both{};
#pragma GCC unroll 4
    for (int u = 0; u < KV; ++u) {
      x[u] = vexp(x[u] - mx);
      both += x[u];
    }
    memcpy(sr, x, sizeof x);
    t.l[r] = t.l[r] * corr + hsum(both);
    t.m[r] = mx;
    if (corr != 1.0f)
      for (int64_t d = 0; d < p.Dp; ++d) t.acc[r][d] *= corr;
  }
  for (int r = t.rows; r < QB; ++r) std::fill(pr[r], pr[r] + KB, 0.0f);
  int kc = (int)std::min<int64_t>(KB, keys - j0);
  for (int64_t d0 = 0; d0 < p.Dp; d0 += DB) {  // acc[:, d0:d0+DB] += P x V[j0:j0+kc, d0:d0+DB]
    v16 o[QB][2];
#pragma GCC unroll 6
    for (int r = 0; r < QB; ++r) o[r][0] = o[r][1] = v16{};
    for (int c = 0; c < kc; ++c) {
      v16 w0, w1;
      memcpy(&w0, vp + (j0 + c) * vrs + d0, sizeof w0);
      memcpy(&w1, vp + (j0 + c) * vrs + d0 + 16, sizeof w1);
#pragma GCC unroll 6
      for (int r = 0; r < QB; ++r) {
        float a = pr[r][c];
        o[r][0] += a * w0;
        o[r][1] += a * w1;
      }
    }
    for (int r = 0; r < t.rows; ++r) {
      v16 a0, a1;
      memcpy(&a0, t.acc[r] + d0, sizeof a0);
      memcpy(&a1, t.acc[r] + d0 + 16, sizeof a1);
      a0 += o[r][0];
      a1 += o[r][1];
      memcpy(t.acc[r] + d0, &a0, sizeof a0);
      memcpy(t.acc[r] + d0 + 16, &a1, sizeof a1);
    }
  }
}

// Query rows [i0, i0 + rows) of head bh (rows <= QB * TILES), as up to TILES tiles that take each
// key block in turn while it is in the L1 cache.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void query_group(const Problem &p, int64_t bh, int64_t i0, int64_t rows) {
  int64_t b = bh / p.H, h = bh % p.H, hk = h / p.G, kv = b * p.Hk + hk;  // (its key/value head)
  const float *kt = p.kt + kv * p.D * p.Sp;
  const float *vp = p.v_direct ? p.v + b * p.vs[0] + hk * p.vs[1] : p.vp + kv * p.Sp * p.Dp;
  const int64_t vrs = p.v_direct ? p.vs[2] : p.Dp;
  const float *q = p.q + b * p.qs[0] + h * p.qs[1];
  Tile tiles[TILES];
  int nt = (int)((rows + QB - 1) / QB);
  for (int ti = 0; ti < nt; ++ti) {
    Tile &t = tiles[ti];
    t.i0 = i0 + ti * QB;
    t.rows = (int)std::min<int64_t>(QB, i0 + rows - t.i0);
    for (int64_t d = 0; d < p.D; ++d)
      for (int r = 0; r < QB; ++r)
        t.q[d * QB + r] = r < t.rows ? q[(t.i0 + r) * p.qs[2] + d * p.qs[3]] * p.scale : 0.0f;
    for (int r = 0; r < QB; ++r) {
      t.m[r] = -std::numeric_limits<float>::infinity();
      t.l[r] = 0.0f;
      std::fill(t.acc[r], t.acc[r] + p.Dp, 0.0f);
    }
  }
  for (int64_t j0 = 0; j0 < p.S; j0 += KB) {
    for (int ti = 0; ti < nt; ++ti) {
      Tile &t = tiles[ti];
      // causal: query i sees keys j <= i (top-left aligned, as ATen)
      int64_t keys = p.causal ? std::min<int64_t>(p.S, t.i0 + t.rows) : p.S;
      if (j0 < keys) tile_step(p, t, kt, vp, vrs, j0, keys);
    }
  }
  float *out = p.out + b * p.os[0] + h * p.os[1];
  for (int ti = 0; ti < nt; ++ti) {
    const Tile &t = tiles[ti];
    for (int r = 0; r < t.rows; ++r) {
      float inv = 1.0f / t.l[r];
      float *orow = out + (t.i0 + r) * p.os[2];
      for (int64_t d = 0; d < p.D; ++d) orow[d * p.os[3]] = t.acc[r][d] * inv;
      p.lse[bh * p.L + t.i0 + r] = t.m[r] + std::log(t.l[r]);
    }
  }
}

// Dense strides for `sizes` in the order of `like`'s strides (outermost first; ties keep the dim
// order): the layout at::empty_like gives a result shaped like q.
std::vector<int64_t> strides_like(at::IntArrayRef sizes, at::IntArrayRef like) {
  int64_t n = (int64_t)sizes.size();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like[a] > like[b]; });
  std::vector<int64_t> strides(n);
  int64_t s = 1;
  for (int64_t i = n - 1; i >= 0; --i) {
    strides[order[i]] = s;
    s *= std::max<int64_t>(sizes[order[i]], 1);
  }
  return strides;
}

void check_inputs(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "dynamo::attention: q, k, v must be [batch, heads, rows, head size]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "dynamo::attention: float32 only");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0,
              "dynamo::attention: q, k, v differ in batch, or q's heads are not a multiple of k's and v's");
  TORCH_CHECK(k.size(2) == v.size(2), "dynamo::attention: k and v have different numbers of keys");
  TORCH_CHECK(q.size(3) == k.size(3) && q.size(3) == v.size(3), "dynamo::attention: q, k, v must have one head size");
  TORCH_CHECK(q.size(3) <= kMaxHead, "dynamo::attention: head size above ", kMaxHead);
}

std::tuple<at::Tensor, at::Tensor> attention_meta(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                                  double scale, bool causal) {
  check_inputs(q, k, v);
  // q's own strides where q is dense (as eager's empty_like), else dense ones in q's dim order
  auto out = at::empty_strided(q.sizes(), q.is_non_overlapping_and_dense() ? q.strides().vec()
                                                                             : strides_like(q.sizes(), q.strides()),
                               q.options());
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  return {out, lse};
}

// Which kernel a call runs: the one above, or ATen's CPU flash attention (the same math and
// results' layout). The kernel's score tile keeps 24 512-bit accumulators in registers, which
// AVX-512's 32 vector registers hold; with AVX2's 16 they spill to the stack on every step
// (measured on an AVX2-only AMD EPYC: 23x slower than ATen's at [8, 4, 128, 64]), so there ATen's
// runs. With AVX-512 neither is known to win everywhere (on an Intel Xeon, ATen's was 1.1-1.4x
// faster at BERT's and ViT's shapes in a quiet run, within noise in others): after one warm-up
// call, the next kTimedCalls calls of each problem shape run both, in turns, and later calls of
// that shape run the faster, as the product steps choose their GEMM (DYNAMO_PRINT_CHOICES prints
// each choice). While the two fastest times are within kClearWin of each other the turns go on,
// up to kMaxTimedCalls (at BERT's [1, 4, 128, 32] ATen's kernel ran 61 us steadily but 90-98 us
// in some runs' three turns, and the slower kernel was chosen in 2 runs of 3). A sweep of shapes
// measures its first ones only (sweep_default).
// DYNAMO_ATTENTION=own or =aten forces either (the tests check the kernel on any CPU).
enum class Kernel { Own, Aten, Measure };

bool wide_vectors() {
  static const bool wide = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return wide;
}

constexpr int kTimedCalls = 3, kMaxTimedCalls = 8;
constexpr double kClearWin = 1.3;

// One problem shape's measurement: the fastest call of each kernel so far.
struct ShapeChoice {
  int timed = 0;
  double t[2] = {1e30, 1e30};  // [own, aten], seconds
  Kernel chosen = Kernel::Measure;
  uint64_t last = 0;  // g_clock at its latest measured call
};

struct ShapeKey {
  int64_t v[8];
  bool operator==(const ShapeKey &o) const { return std::memcmp(v, o.v, sizeof v) == 0; }
};
struct ShapeHash {
  size_t operator()(const ShapeKey &k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ (size_t)x) * 1099511628211ull;
    return h;
  }
};

std::mutex g_choice_mu;
std::unordered_map<ShapeKey, ShapeChoice, ShapeHash> g_choices;
uint64_t g_clock = 0;  // calls that looked their shape up in g_choices (a sweep's every call)
constexpr size_t kMaxShapes = 4096;  // past that, new shapes run the default (a sweep of sizes)

// The shape's key: sizes, causality, and whether each of q, k, v has unit-stride rows (what the
// kernels' speed depends on besides the sizes).
ShapeKey shape_key(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool causal) {
  return ShapeKey{{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), (int64_t)causal,
                   (q.stride(3) == 1) | (k.stride(3) == 1) << 1 | (v.stride(3) == 1) << 2, k.size(1)}};
}

// While kSweepShapes shapes are still being measured (sizes that keep changing: a sweep of
// sequence lengths, each called a few times, where the turns never finish and double every
// call's attention), a new shape is not measured: it takes the kernel of the decided shape most
// like it (the same heads, head size, causality and strides; the nearest work, batch x rows x
// keys, by ratio), or the own kernel while none is decided. Either kernel gives the same results.
// Called with g_choice_mu held.
// (Shapes whose turns stopped short long ago -- called a few times, then no more -- do not count:
// only those measured within the last kRecentCalls look-ups; a sweep of many shapes so measures
// about kSweepShapes of every kRecentCalls new ones.)
constexpr size_t kSweepShapes = 8;
constexpr uint64_t kRecentCalls = 64;

ShapeChoice sweep_default(const ShapeKey &key) {
  ShapeChoice c;
  c.last = g_clock;
  size_t measuring = 0;
  double best = 1e300;
  Kernel nearest = Kernel::Own;
  for (const auto &[k, v] : g_choices) {
    if (v.chosen == Kernel::Measure) {
      measuring += g_clock - v.last < kRecentCalls;
      continue;
    }
    if (k.v[1] != key.v[1] || k.v[4] != key.v[4] || k.v[5] != key.v[5] || k.v[6] != key.v[6]) continue;
    const double work = (double)key.v[0] * key.v[2] * key.v[3], there = (double)k.v[0] * k.v[2] * k.v[3];
    const double d = std::fabs(std::log((work + 1) / (there + 1)));
    if (d < best) {
      best = d;
      nearest = v.chosen;
    }
  }
  if (measuring >= kSweepShapes) c.chosen = nearest;
  return c;
}

Kernel kernel_for(const ShapeKey &key) {
  const char *force = std::getenv("DYNAMO_ATTENTION");
  if (force && std::strcmp(force, "own") == 0) return Kernel::Own;
  if (force && std::strcmp(force, "aten") == 0) return Kernel::Aten;
  if (!wide_vectors()) return Kernel::Aten;
  // One or two query rows per packed key/value head (a decode step: one new token, perhaps two
  // query heads sharing its keys): packing K^T costs as much as the scores, which ATen's kernel
  // reads from K in place.
  if (key.v[2] * (key.v[1] / std::max<int64_t>(key.v[7], 1)) <= 2) return Kernel::Aten;
  // A decided choice never changes (entries are never removed): each thread keeps its last one,
  // so a model's steady calls at one shape take no lock.
  thread_local ShapeKey last_key{{-1}};
  thread_local Kernel last_kernel = Kernel::Measure;
  if (last_kernel != Kernel::Measure && last_key == key) return last_kernel;
  std::lock_guard<std::mutex> l(g_choice_mu);
  ++g_clock;
  auto it = g_choices.find(key);
  if (it == g_choices.end()) {
    if (g_choices.size() >= kMaxShapes) return Kernel::Own;
    it = g_choices.emplace(key, sweep_default(key)).first;
  }
  last_key = key;
  last_kernel = it->second.chosen;
  return last_kernel;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ATen's CPU flash attention into out and lse.
void aten_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double scale, bool causal,
                    at::Tensor &out, at::Tensor &lse) {
  auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, std::nullopt, scale);
  if (o.strides() == out.strides()) out = o; else out.copy_(o);
  lse.copy_(l);  // (ATen's is laid out [batch, rows, heads]; ours is contiguous)
}

// The kernel above into out and lse.
void own_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double scale, bool causal,
                   at::Tensor &out, at::Tensor &lse) {
  Problem p{};
  p.B = q.size(0), p.H = q.size(1), p.L = q.size(2), p.S = k.size(2), p.D = q.size(3);
  p.Hk = k.size(1), p.G = p.H / p.Hk;
  p.q = q.data_ptr<float>(), p.k = k.data_ptr<float>(), p.v = v.data_ptr<float>();
  for (int i = 0; i < 4; ++i) p.qs[i] = q.stride(i), p.ks[i] = k.stride(i), p.vs[i] = v.stride(i), p.os[i] = out.stride(i);
  p.out = out.data_ptr<float>(), p.lse = lse.data_ptr<float>();
  p.scale = (float)scale, p.causal = causal;
  p.Sp = round_up(p.S, KB), p.Dp = round_up(p.D, DB);
  int64_t heads = p.B * p.H, kv_heads = p.B * p.Hk;
  p.v_direct = p.vs[3] == 1 && p.D == p.Dp;
  // (not zeroed: pack_head writes every element, the padding included)
  std::unique_ptr<float[]> packed(new float[(size_t)(kv_heads * (p.D * p.Sp + (p.v_direct ? 0 : p.Sp * p.Dp)))]);
  float *kt = packed.get(), *vp = packed.get() + kv_heads * p.D * p.Sp;
  p.kt = kt, p.vp = vp;
  const int64_t group = QB * TILES, groups = (p.L + group - 1) / group;
  if (groups == 1) {  // one group of queries per head: a key/value head's packing and its query heads in one task
    at::parallel_for(0, kv_heads, 1, [&](int64_t b, int64_t e) {
      for (int64_t kv = b; kv < e; ++kv) {
        pack_head(p, kv, kt + kv * p.D * p.Sp, vp + kv * p.Sp * p.Dp);
        const int64_t first = (kv / p.Hk) * p.H + (kv % p.Hk) * p.G;
        for (int64_t g = 0; g < p.G; ++g) query_group(p, first + g, 0, p.L);
      }
    });
    return;
  }
  at::parallel_for(0, kv_heads, 1, [&](int64_t b, int64_t e) {
    for (int64_t kv = b; kv < e; ++kv) pack_head(p, kv, kt + kv * p.D * p.Sp, vp + kv * p.Sp * p.Dp);
  });
  at::parallel_for(0, heads * groups, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      int64_t bh = w / groups, i0 = (w % groups) * group;
      query_group(p, bh, i0, std::min<int64_t>(group, p.L - i0));
    }
  });
}

std::tuple<at::Tensor, at::Tensor> attention_cpu(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                                 double scale, bool causal) {
  auto [out, lse] = attention_meta(q, k, v, scale, causal);
  if (out.numel() == 0) return {out, lse};
  if (k.size(2) == 0) {  // no keys: softmax over nothing (as ATen's math path: NaN rows)
    out.fill_(std::numeric_limits<float>::quiet_NaN());
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  ShapeKey key = shape_key(q, k, v, causal);
  Kernel kernel = kernel_for(key);
  if (kernel == Kernel::Own) {
    own_attention(q, k, v, scale, causal, out, lse);
    return {out, lse};
  }
  if (kernel == Kernel::Aten) {
    aten_attention(q, k, v, scale, causal, out, lse);
    return {out, lse};
  }
  // Measuring: both kernels, the order alternating between calls (the second can find the
  // first's threads still spinning); the own kernel's result is returned (they agree within
  // rounding).
  int turn;
  {
    std::lock_guard<std::mutex> l(g_choice_mu);
    turn = g_choices[key].timed;
  }
  double t[2] = {1e30, 1e30};
  at::Tensor out2 = at::empty_like(out), lse2 = at::empty_like(lse);
  for (int i = 0; i < 2; ++i) {
    int side = (turn + i) % 2;
    double t0 = seconds_now();
    if (side == 0)
      own_attention(q, k, v, scale, causal, out, lse);
    else
      aten_attention(q, k, v, scale, causal, out2, lse2);
    t[side] = seconds_now() - t0;
  }
  std::lock_guard<std::mutex> l(g_choice_mu);
  ShapeChoice &c = g_choices[key];
  c.last = g_clock;
  if (c.timed++ > 0)  // (the first call warms both up: ATen's allocates and faults in its buffers)
    for (int s = 0; s < 2; ++s) c.t[s] = std::min(c.t[s], t[s]);
  const bool clear = c.t[0] > kClearWin * c.t[1] || c.t[1] > kClearWin * c.t[0];
  if (c.chosen == Kernel::Measure && ((c.timed > kTimedCalls && clear) || c.timed > kMaxTimedCalls)) {
    c.chosen = c.t[1] < c.t[0] ? Kernel::Aten : Kernel::Own;
    if (std::getenv("DYNAMO_PRINT_CHOICES"))
      fprintf(stderr, "dynamo::attention [%lld,%lld,%lld,%lld,%lld]%s: %s (own %.1f us, aten %.1f us)\n",
              (long long)key.v[0], (long long)key.v[1], (long long)key.v[2], (long long)key.v[3], (long long)key.v[4],
              causal ? " causal" : "", c.chosen == Kernel::Aten ? "aten" : "own", c.t[0] * 1e6, c.t[1] * 1e6);
  }
  return {out, lse};
}

}  // namespace

// softmax(q k^T * scale [+ causal mask]) v over [batch, heads, rows, head size] float32 views of
// any strides; returns the output (laid out in q's dim order, as eager's CPU flash attention) and
// the log-sum-exp of each row's scores ([batch, heads, rows]).
TORCH_LIBRARY_FRAGMENT(dynamo, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, float scale, bool causal) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(dynamo, CPU, m) { m.impl("attention", &attention_cpu); }
TORCH_LIBRARY_IMPL(dynamo, Meta, m) { m.impl("attention", &attention_meta); }
