// attention.cpp -- dynamo::attention, the fused attention kernel traces run for
// scaled_dot_product_attention (and nn.MultiheadAttention's decomposed fast path): per query block,
// the scores of one block of keys at a time, an online softmax (running row max and sum, the
// accumulated output rescaled when the max grows), and the probabilities times the values, so the
// L x S score matrix never exists in memory. Same math as ATen's CPU flash attention
// (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp); results differ by rounding only.
//
// Layout: K is packed once per call as K^T per (batch, head) (head size x keys, keys padded to
// the block), V as keys x head size (padded to the block), both zero-padded; the query block is
// copied with the scale folded in. The score tile (QB rows x KB keys) is a register-blocked
// product like runtime/gemm.cpp's micro-kernel; exp is a vectorized polynomial (|rel err| < 2e-7
// on the range softmax uses). Compiled for AVX-512, AVX2 and the baseline (target_clones).
// (vexp is always inlined into the target_clones bodies: the AVX-512 vector ABI note does not apply)
#pragma GCC diagnostic ignored "-Wpsabi"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int QB = 6;    // query rows per block (the score tile's rows)
constexpr int KB = 32;   // keys per block (the score tile's columns: two 16-float vectors)
constexpr int DB = 32;   // output columns per register tile of the P x V product
constexpr int64_t kMaxHead = 512;

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4)));

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// exp(x) on 16 floats: x = n ln2 + r, |r| <= ln2/2, exp(r) by its degree-6 Taylor polynomial,
// 2^n through the exponent bits. -inf (a masked score) gives 0; x below -87 underflows to 0.
__attribute__((always_inline)) inline v16 vexp(v16 x) {
  const v16i under = x < -87.0f;  // -1 where the result underflows (and at -inf): 0 there
  v16 t = x * 1.44269504088896341f;
  t = t < -126.0f ? v16{} - 126.0f : t;
  t = t > 126.0f ? v16{} + 126.0f : t;
  v16i ni = __builtin_convertvector(t, v16i);  // toward zero
  ni += (v16i)(__builtin_convertvector(ni, v16) > t);  // -1 where that went up: floor
  ni -= (v16i)((t - __builtin_convertvector(ni, v16)) > 0.5f);  // to nearest
  const v16 nf = __builtin_convertvector(ni, v16);
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

struct Problem {
  int64_t B, H, L, S, D;            // batch, heads, queries, keys, head size (of q, k and v)
  const float *q, *k, *v;
  int64_t qs[4], ks[4], vs[4], os[4];  // element strides of q, k, v, out ([B, H, rows, D])
  float *out, *lse;                 // lse: [B, H, L] contiguous
  float scale;
  bool causal;
  int64_t Sp, Dp;                   // keys padded to KB, head size padded to DB
  const float *kt, *vp;             // packed: per (b, h) K^T [D, Sp] and V [Sp, Dp]
};

// K^T and V of head bh into the packed buffers (zero-padded).
void pack_head(const Problem &p, int64_t bh, float *kt, float *vp) {
  int64_t b = bh / p.H, h = bh % p.H;
  const float *k = p.k + b * p.ks[0] + h * p.ks[1];
  const float *v = p.v + b * p.vs[0] + h * p.vs[1];
  for (int64_t d = 0; d < p.D; ++d) {
    float *row = kt + d * p.Sp;
    for (int64_t j = 0; j < p.S; ++j) row[j] = k[j * p.ks[2] + d * p.ks[3]];
    std::fill(row + p.S, row + p.Sp, 0.0f);
  }
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

// One block of up to QB query rows [i0, i0 + rows) of head bh.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void query_block(const Problem &p, int64_t bh, int64_t i0, int rows) {
  int64_t b = bh / p.H, h = bh % p.H;
  const float *kt = p.kt + bh * p.D * p.Sp;
  const float *vp = p.vp + bh * p.Sp * p.Dp;
  const float *q = p.q + b * p.qs[0] + h * p.qs[1];
  float qb[kMaxHead * QB];  // the block's queries times the scale, d-major: qb[d * QB + r]
  for (int64_t d = 0; d < p.D; ++d)
    for (int r = 0; r < QB; ++r)
      qb[d * QB + r] = r < rows ? q[(i0 + r) * p.qs[2] + d * p.qs[3]] * p.scale : 0.0f;
  alignas(64) float acc[QB][kMaxHead];  // output accumulators, rescaled as the row max grows
  float m[QB], l[QB];
  for (int r = 0; r < QB; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    std::fill(acc[r], acc[r] + p.Dp, 0.0f);
  }
  // causal: query i sees keys j <= i (top-left aligned, as ATen)
  int64_t keys = p.causal ? std::min<int64_t>(p.S, i0 + rows) : p.S;
  for (int64_t j0 = 0; j0 < keys; j0 += KB) {
    v16 s[QB][2];
#pragma GCC unroll 6
    for (int r = 0; r < QB; ++r) s[r][0] = s[r][1] = v16{};
    for (int64_t d = 0; d < p.D; ++d) {
      v16 k0 = *reinterpret_cast<const v16 *>(kt + d * p.Sp + j0);
      v16 k1 = *reinterpret_cast<const v16 *>(kt + d * p.Sp + j0 + 16);
#pragma GCC unroll 6
      for (int r = 0; r < QB; ++r) {
        float a = qb[d * QB + r];
        s[r][0] += a * k0;
        s[r][1] += a * k1;
      }
    }
    alignas(64) float pr[QB][KB];  // this block's probabilities (unnormalized)
    for (int r = 0; r < rows; ++r) {
      v16 x0 = s[r][0], x1 = s[r][1];
      int64_t last = p.causal ? std::min<int64_t>(p.S, i0 + r + 1) : p.S;  // keys [j0, last) count
      if (j0 + KB > last) {  // the last block, or the causal diagonal: keys past `last` are masked
        float *sr = pr[r];
        memcpy(sr, &x0, sizeof x0);
        memcpy(sr + 16, &x1, sizeof x1);
        for (int64_t c = std::max<int64_t>(0, last - j0); c < KB; ++c) sr[c] = -std::numeric_limits<float>::infinity();
        memcpy(&x0, sr, sizeof x0);
        memcpy(&x1, sr + 16, sizeof x1);
      }
      v16 top = x0 > x1 ? x0 : x1;
      float mx = m[r];
      for (int c = 0; c < 16; ++c) mx = std::max(mx, top[c]);
      float corr = mx == m[r] ? 1.0f : std::exp(m[r] - mx);  // exp(-inf) = 0 on the first block
      v16 e0 = vexp(x0 - mx), e1 = vexp(x1 - mx);
      memcpy(pr[r], &e0, sizeof e0);
      memcpy(pr[r] + 16, &e1, sizeof e1);
      v16 both = e0 + e1;
      float sum = 0.0f;
      for (int c = 0; c < 16; ++c) sum += both[c];
      l[r] = l[r] * corr + sum;
      m[r] = mx;
      if (corr != 1.0f)
        for (int64_t d = 0; d < p.Dp; ++d) acc[r][d] *= corr;
    }
    for (int r = rows; r < QB; ++r) std::fill(pr[r], pr[r] + KB, 0.0f);
    int kc = (int)std::min<int64_t>(KB, keys - j0);
    for (int64_t d0 = 0; d0 < p.Dp; d0 += DB) {  // acc[:, d0:d0+DB] += P x V[j0:j0+kc, d0:d0+DB]
      v16 o[QB][2];
#pragma GCC unroll 6
      for (int r = 0; r < QB; ++r) o[r][0] = o[r][1] = v16{};
      for (int c = 0; c < kc; ++c) {
        const float *vrow = vp + (j0 + c) * p.Dp + d0;
        v16 w0 = *reinterpret_cast<const v16 *>(vrow);
        v16 w1 = *reinterpret_cast<const v16 *>(vrow + 16);
#pragma GCC unroll 6
        for (int r = 0; r < QB; ++r) {
          float a = pr[r][c];
          o[r][0] += a * w0;
          o[r][1] += a * w1;
        }
      }
      for (int r = 0; r < rows; ++r) {
        v16 a0, a1;
        memcpy(&a0, acc[r] + d0, sizeof a0);
        memcpy(&a1, acc[r] + d0 + 16, sizeof a1);
        a0 += o[r][0];
        a1 += o[r][1];
        memcpy(acc[r] + d0, &a0, sizeof a0);
        memcpy(acc[r] + d0 + 16, &a1, sizeof a1);
      }
    }
  }
  float *out = p.out + b * p.os[0] + h * p.os[1];
  for (int r = 0; r < rows; ++r) {
    float inv = 1.0f / l[r];
    float *orow = out + (i0 + r) * p.os[2];
    for (int64_t d = 0; d < p.D; ++d) orow[d * p.os[3]] = acc[r][d] * inv;
    p.lse[bh * p.L + i0 + r] = m[r] + std::log(l[r]);
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
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0) && q.size(1) == k.size(1) && q.size(1) == v.size(1),
              "dynamo::attention: q, k, v differ in batch or heads");
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

std::tuple<at::Tensor, at::Tensor> attention_cpu(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                                 double scale, bool causal) {
  auto [out, lse] = attention_meta(q, k, v, scale, causal);
  Problem p{};
  p.B = q.size(0), p.H = q.size(1), p.L = q.size(2), p.S = k.size(2), p.D = q.size(3);
  if (out.numel() == 0) return {out, lse};
  if (p.S == 0) {  // no keys: softmax over nothing (as ATen's math path: NaN rows)
    out.fill_(std::numeric_limits<float>::quiet_NaN());
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  p.q = q.data_ptr<float>(), p.k = k.data_ptr<float>(), p.v = v.data_ptr<float>();
  for (int i = 0; i < 4; ++i) p.qs[i] = q.stride(i), p.ks[i] = k.stride(i), p.vs[i] = v.stride(i), p.os[i] = out.stride(i);
  p.out = out.data_ptr<float>(), p.lse = lse.data_ptr<float>();
  p.scale = (float)scale, p.causal = causal;
  p.Sp = round_up(p.S, KB), p.Dp = round_up(p.D, DB);
  int64_t heads = p.B * p.H;
  std::vector<float> packed((size_t)(heads * (p.D * p.Sp + p.Sp * p.Dp)));
  float *kt = packed.data(), *vp = packed.data() + heads * p.D * p.Sp;
  p.kt = kt, p.vp = vp;
  at::parallel_for(0, heads, 1, [&](int64_t b, int64_t e) {
    for (int64_t bh = b; bh < e; ++bh) pack_head(p, bh, kt + bh * p.D * p.Sp, vp + bh * p.Sp * p.Dp);
  });
  int64_t blocks = (p.L + QB - 1) / QB;
  at::parallel_for(0, heads * blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      int64_t bh = w / blocks, i0 = (w % blocks) * QB;
      query_block(p, bh, i0, (int)std::min<int64_t>(QB, p.L - i0));
    }
  });
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
