// onednn_conv.cpp -- convolutions through oneDNN (see onednn_conv.h).
//
// Per step: forward-inference primitives with `any` layouts for source, weights and
// destination (oneDNN picks its blocked formats) -- the direct algorithm, and Winograd where
// oneDNN has it -- reorders from and to the trace's plain layouts around them, and a
// user-managed scratchpad per call so that several threads may run the same entry. The
// weights' reordered copy is kept as derived.h says (same address, version and sampled
// contents); a call without a version reorders them again.
//
// Which path runs is measured, not assumed: the first call (two unless one path wins the
// first by 1.5x over every other) runs LibTorch, oneDNN's direct kernel and a Winograd
// kernel (oneDNN's; dynamo's own, winograd.h, for channels-last steps), and the step keeps
// the fastest (1x1 convolutions are often a plain GEMM that the BLAS does better). Winograd's
// result must agree with LibTorch's within kWinogradTolerance on every timed call, or the
// step never uses it. A oneDNN failure of any kind makes the step use LibTorch from then on.
#include "onednn_conv.h"

#include "buffer_pool.h"
#include "derived.h"
#include "jit/ir.h"
#include "winograd.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>

namespace dynamo::runtime {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr int kTimedCalls = 2;
constexpr int kWatchCalls = 8;

dnnl::engine &cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One stream per thread (a CPU stream is cheap, but not free to make on every call).
dnnl::stream &cpu_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

memory::dims dims_of(c10::IntArrayRef a) { return memory::dims(a.begin(), a.end()); }

// The boxed aten::convolution arguments, checked: input, weight, bias?, stride, padding,
// dilation, transposed, output_padding, groups.
struct ConvArgs {
  at::Tensor x, w, b;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
};

bool int_list(const c10::IValue &v, size_t n, std::vector<int64_t> *out) {
  if (!v.isIntList()) return false;
  *out = v.toIntVector();
  if (out->size() == 1 && n > 1) out->assign(n, (*out)[0]);
  return out->size() == n;
}

// dynamo::conv_nhwc's input [N, H, W, C] ([N, D, H, W, C]) as the [N, C, H, W] view oneDNN describes.
at::Tensor nchw_view(const at::Tensor &x) {
  return x.dim() == 5 ? x.permute({0, 4, 1, 2, 3}) : x.permute({0, 3, 1, 2});
}

// Why oneDNN cannot run these arguments, or "" when it can. nhwc: dynamo::conv_nhwc's 7
// (input, weight, bias?, stride, padding, dilation, groups; input and result [N, H, W, C]).
std::string parse(const torch::jit::Stack &st, bool nhwc, ConvArgs *a) {
  if (st.size() != (nhwc ? 7u : 9u)) return nhwc ? "not dynamo::conv_nhwc's 7 arguments" : "not aten::convolution's 9 arguments";
  if (!st[0].isTensor() || !st[1].isTensor()) return "input or weight is not a tensor";
  a->x = st[0].toTensor();
  a->w = st[1].toTensor();
  if (nhwc) {
    if (a->x.dim() != 4 && a->x.dim() != 5) return "dynamo::conv_nhwc's input is not 4-D or 5-D";
    a->x = nchw_view(a->x);
  }
  int64_t sd = a->x.dim() - 2;
  if (sd < 1 || sd > 3 || a->w.dim() != sd + 2) return "not a 1-3 dimensional convolution";
  if (a->x.scalar_type() != at::kFloat || a->w.scalar_type() != at::kFloat) return "not float32";
  if (st[2].isTensor()) {
    a->b = st[2].toTensor();
    if (a->b.scalar_type() != at::kFloat || a->b.dim() != 1) return "bias is not a float32 vector";
  } else if (!st[2].isNone()) {
    return "bias is not a tensor";
  }
  if (!nhwc && (!st[6].isBool() || st[6].toBool())) return "transposed convolution";
  const c10::IValue &groups = st[nhwc ? 6 : 8];
  if (!groups.isInt()) return "groups is not an int";
  a->groups = groups.toInt();
  if (!int_list(st[3], sd, &a->stride) || !int_list(st[4], sd, &a->padding) || !int_list(st[5], sd, &a->dilation))
    return "stride, padding or dilation is not a list of ints";
  if (a->x.numel() == 0 || a->w.numel() == 0) return "empty tensor";
  if (a->groups < 1 || a->x.size(1) != a->w.size(1) * a->groups || a->w.size(0) % a->groups) return "channel mismatch";
  for (int64_t k = 0; k < sd; ++k)
    if (a->stride[k] < 1 || a->dilation[k] < 1 || a->padding[k] < 0) return "bad stride, dilation or padding";
  return "";
}

// The memory descriptor of a strided tensor as it is (dims and strides in elements).
memory::desc plain_desc(const at::Tensor &t) {
  return memory::desc(dims_of(t.sizes()), memory::data_type::f32, dims_of(t.strides()));
}

// The weight as oneDNN's (groups, out/groups, in/groups, k...) when grouped.
memory::desc weight_desc(const at::Tensor &w, int64_t groups) {
  if (groups == 1) return plain_desc(w);
  memory::dims d = dims_of(w.sizes()), s = dims_of(w.strides());
  d[0] /= groups;
  d.insert(d.begin(), groups);
  s.insert(s.begin(), s[0] * d[1]);
  return memory::desc(d, memory::data_type::f32, s);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// Temporaries (reordered source and destination, scratchpads: Winograd's are ~240 MB for 100
// regions of 512 channels) come from one process-wide pool: glibc would map and unmap blocks that
// large on every call (a page fault per 4 KiB: ~15% of the keypoint head's time). Leaked on
// purpose: a tensor holding a block may outlive static destructors.
BufferPool &conv_pool() {
  static BufferPool *p = new BufferPool(size_t(1) << 30);
  return *p;
}

at::Tensor pooled(c10::IntArrayRef sizes, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  Buffer b = conv_pool().acquire(size_t(n) * c10::elementSize(dtype));
  if (!b.data) throw std::bad_alloc();
  return at::from_blob(b.data, sizes, [b](void *) { conv_pool().release(b); }, at::TensorOptions().dtype(dtype));
}

at::Tensor pooled_bytes(size_t bytes) { return pooled({(int64_t)bytes}, at::kByte); }

// Is it worth building a Winograd primitive? oneDNN 2.6 has F(4x4, 3x3) kernels for 2-D,
// 3x3, stride 1, undilated, ungrouped convolutions (it refuses the rest itself); 2.25-4x fewer
// multiplications, about 2x faster on AVX-512 here, at a rounding error a few times the direct
// kernel's (checked per step against LibTorch's result before it is used).
bool winograd_shape(const ConvArgs &a, bool nhwc) {
  if (nhwc) return false;  // (its kernels read and write oneDNN's blocked layouts only)
  if (const char *env = getenv("DYNAMO_CONV_WINOGRAD"))
    if (!strcmp(env, "0")) return false;
  return a.x.dim() == 4 && a.groups == 1 && a.w.size(2) == 3 && a.w.size(3) == 3 && a.stride[0] == 1 &&
         a.stride[1] == 1 && a.dilation[0] == 1 && a.dilation[1] == 1 && a.x.size(1) % 16 == 0 && a.w.size(0) % 16 == 0;
}

// How far a Winograd result may be from LibTorch's: relative to the output's largest magnitude
// (measured: 2e-6 to 4e-6 for 64-512 channels; the direct kernel's own difference is ~1e-6).
constexpr double kWinogradTolerance = 2e-5;
constexpr double kWinogradMargin = 1.25;  // how much faster than every other path it must be
// dynamo's own F(2, 3) (channels-last steps) rounds no worse than the direct kernel (5e-7 of the
// largest output on r3d_18's first stage, the direct kernel 1.6e-6 from LibTorch's) and
// transforms the weights in milliseconds: it needs only to be clearly faster.
constexpr double kOwnWinogradMargin = 1.1;
constexpr double kWinogradPayback = 200;  // calls within which its one-time cost must come back

}  // namespace

// One oneDNN primitive for a step's (static) shapes, by one algorithm.
struct OnednnConv {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory::desc src_user, dst_user;
  std::vector<int64_t> out_sizes;
  dnnl::reorder src_in, dst_out;  // plain <-> the primitive's layouts, when they differ
  bool reorder_src = false, reorder_dst = false;
  Derived<at::Tensor> packed_w;  // the reordered weights (derived.h says when they are reused)
  bool nhwc = false;             // source and destination channels-last (dynamo::conv_nhwc)

  // Throws dnnl::error when oneDNN has no implementation (Winograd for most shapes). nhwc: the
  // primitive reads and writes channels-last as the trace holds it (no `any`: oneDNN would
  // choose its blocked layout and both reorders with it).
  OnednnConv(const ConvArgs &a, dnnl::algorithm alg, bool channels_last) : nhwc(channels_last) {
    if (alg == dnnl::algorithm::convolution_direct && jit::fault_injected("conv_direct"))  // tests
      throw std::runtime_error("injected fault: no direct kernel");
    int64_t sd = a.x.dim() - 2;
    memory::dims strides(a.stride.begin(), a.stride.end()), dil(sd), pl(a.padding.begin(), a.padding.end()), pr(sd);
    out_sizes = {a.x.size(0), a.w.size(0)};
    for (int64_t k = 0; k < sd; ++k) {
      int64_t in = a.x.size(k + 2), ek = (a.w.size(k + 2) - 1) * a.dilation[k] + 1;
      int64_t o = (in + 2 * a.padding[k] - ek) / a.stride[k] + 1;
      if (o < 1) throw std::runtime_error("empty output");
      out_sizes.push_back(o);
      dil[k] = a.dilation[k] - 1;
      pr[k] = (o - 1) * a.stride[k] + ek - in - a.padding[k];
    }
    auto any = [](const memory::dims &d) { return memory::desc(d, memory::data_type::f32, tag::any); };
    auto act = [&](const memory::dims &d) {
      return memory::desc(d, memory::data_type::f32, nhwc ? (sd == 1 ? tag::nwc : sd == 2 ? tag::nhwc : tag::ndhwc) : tag::any);
    };
    memory::desc bias_md = a.b.defined() ? memory::desc({a.w.size(0)}, memory::data_type::f32, tag::a) : memory::desc();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // oneDNN 3.x (Debian 13's libdnnl-dev) dropped the operation descriptor: the primitive
    // descriptor takes its fields directly. 2.x (Debian 12's) builds it from one.
#if DNNL_VERSION_MAJOR >= 3
    memory::dims wd = weight_desc(a.w, a.groups).get_dims();
    pd = dnnl::convolution_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_inference, alg,
                                                   act(dims_of(a.x.sizes())), any(wd), bias_md, act(out_sizes),
                                                   strides, dil, pl, pr, attr);
#else
    memory::dims wd = weight_desc(a.w, a.groups).dims();
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, act(dims_of(a.x.sizes())), any(wd),
                                      bias_md, act(out_sizes), strides, dil, pl, pr);
    pd = dnnl::convolution_forward::primitive_desc(d, attr, cpu_engine());
#endif
    prim = dnnl::convolution_forward(pd);
    // (a channels-last input as the nhwc tag: strides of size-1 dims would tell them apart)
    if (nhwc && sd == 2 && a.x.is_contiguous(at::MemoryFormat::ChannelsLast))
      src_user = memory::desc(dims_of(a.x.sizes()), memory::data_type::f32, tag::nhwc);
    else if (nhwc && sd == 3 && a.x.is_contiguous(at::MemoryFormat::ChannelsLast3d))
      src_user = memory::desc(dims_of(a.x.sizes()), memory::data_type::f32, tag::ndhwc);
    else
      src_user = plain_desc(a.x);
    dst_user = memory::desc(out_sizes, memory::data_type::f32,
                            nhwc ? (sd == 2 ? tag::nhwc : tag::ndhwc)
                                 : sd == 1 ? tag::ncw : sd == 2 ? tag::nchw : tag::ncdhw);
    reorder_src = pd.src_desc() != src_user;
    reorder_dst = pd.dst_desc() != dst_user;
    if (reorder_src) src_in = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src_user, cpu_engine(), pd.src_desc()));
    if (reorder_dst) dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), pd.dst_desc(), cpu_engine(), dst_user));
  }

  // The weights in the primitive's layout (reordered now, or the kept copy).
  std::shared_ptr<const at::Tensor> weights(const ConvArgs &a, const uint64_t *version, dnnl::stream &strm) {
    memory::desc user = weight_desc(a.w, a.groups);
    if (pd.weights_desc() == user) return std::make_shared<const at::Tensor>(a.w);
    std::optional<ContentKey> key;
    if (version) key = ContentKey::of(a.w, *version);
    return packed_w.get(key ? &*key : nullptr, [&] {
      at::Tensor packed = at::empty({(int64_t)pd.weights_desc().get_size()}, at::kByte);
      memory from(user, cpu_engine(), a.w.data_ptr()), to(pd.weights_desc(), cpu_engine(), packed.data_ptr());
      dnnl::reorder(from, to).execute(strm, from, to);
      strm.wait();
      return packed;
    });
  }

  at::Tensor run(const ConvArgs &a, const uint64_t *version) {
    dnnl::stream &strm = cpu_stream();
    std::shared_ptr<const at::Tensor> w = weights(a, version, strm);
    // [N, C, spatial...], or [N, spatial..., C] for conv_nhwc. From the pool: a result of
    // megabytes malloc'ed and freed on every call can cost a page fault per 4 KiB, depending on
    // the heap's state (ssdlite320's backbone: ~4,500 faults a call, +20%, after torch.compile
    // had run in the same process). The buffer goes back to the pool when the tensor dies, so a
    // result the program gets stays its own (not resizable, as the kernels' results).
    std::vector<int64_t> out_shape = out_sizes;
    if (nhwc) {
      out_shape.erase(out_shape.begin() + 1);
      out_shape.push_back(out_sizes[1]);
    }
    at::Tensor out = pooled(out_shape, at::kFloat);
    memory src(src_user, cpu_engine(), a.x.data_ptr());
    memory dst(dst_user, cpu_engine(), out.data_ptr());
    memory src_p = src, dst_p = dst;
    at::Tensor src_buf, dst_buf;
    if (reorder_src) {
      src_buf = pooled_bytes(pd.src_desc().get_size());
      src_p = memory(pd.src_desc(), cpu_engine(), src_buf.data_ptr());
      src_in.execute(strm, src, src_p);
    }
    if (reorder_dst) {
      dst_buf = pooled_bytes(pd.dst_desc().get_size());
      dst_p = memory(pd.dst_desc(), cpu_engine(), dst_buf.data_ptr());
    }
    at::Tensor scratch = pooled_bytes(pd.scratchpad_desc().get_size());
    memory wm(pd.weights_desc(), cpu_engine(), w->data_ptr());
    memory sm(pd.scratchpad_desc(), cpu_engine(), scratch.data_ptr());
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, src_p}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dst_p}, {DNNL_ARG_SCRATCHPAD, sm}};
    at::Tensor b;
    if (a.b.defined()) {
      b = a.b.contiguous();
      args.insert({DNNL_ARG_BIAS, memory(pd.bias_desc(), cpu_engine(), b.data_ptr())});
    }
    prim.execute(strm, args);
    if (reorder_dst) dst_out.execute(strm, dst_p, dst);
    strm.wait();
    return out;
  }
};

// LibTorch's own oneDNN (the one inside the torch wheel: 3.x, where the system's is 2.6, whose
// channels-last AVX2 kernels are slower: 128 channels at 8x8, 0.16 against 0.44 ms) through
// mkldnn::_convolution_pointwise, the weight reordered once by aten::mkldnn_reorder_conv2d_weight
// into LibTorch's blocked layout and kept as derived.h says -- what torch.compile runs for a
// frozen convolution. Channels-last steps only (dynamo::conv_nhwc): its input is the channels-last
// view and its result channels-last, so neither side is reordered.
struct PackedConv {
  const c10::OperatorHandle *op = nullptr;  // mkldnn::_convolution_pointwise
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  Derived<at::Tensor> packed_w;

  // Throws when this LibTorch has no oneDNN (a build without MKLDNN) or the shape is not 2-D or 3-D.
  explicit PackedConv(const ConvArgs &a)
      : stride(a.stride), padding(a.padding), dilation(a.dilation), groups(a.groups) {
    if (a.x.dim() != 4 && a.x.dim() != 5) throw std::runtime_error("not a 2-D or 3-D convolution");
    if (!at::hasMKLDNN()) throw std::runtime_error("this LibTorch has no oneDNN");
    auto h = c10::Dispatcher::singleton().findSchema({"mkldnn::_convolution_pointwise", ""});
    if (!h) throw std::runtime_error("this LibTorch has no mkldnn::_convolution_pointwise");
    static c10::OperatorHandle keep = *h;  // (handles stay valid while the op is registered: always)
    op = &keep;
  }

  // a.x: the [N, C, H, W] channels-last view of the step's [N, H, W, C] input; returns [N, H, W, C].
  at::Tensor run(const ConvArgs &a, const uint64_t *version) {
    std::optional<ContentKey> key;
    if (version) key = ContentKey::of(a.w, *version);
    std::shared_ptr<const at::Tensor> w = packed_w.get(key ? &*key : nullptr, [&] {
      if (a.x.dim() == 5)
        return at::mkldnn_reorder_conv3d_weight(a.w.contiguous().to_mkldnn(), padding, stride, dilation, groups,
                                                a.x.sizes());
      return at::mkldnn_reorder_conv2d_weight(a.w.contiguous().to_mkldnn(), padding, stride, dilation, groups,
                                              a.x.sizes());
    });
    torch::jit::Stack st;
    st.emplace_back(a.x);
    st.emplace_back(*w);
    st.emplace_back(a.b.defined() ? c10::IValue(a.b) : c10::IValue());
    st.emplace_back(padding);
    st.emplace_back(stride);
    st.emplace_back(dilation);
    st.emplace_back(groups);
    st.emplace_back(std::string("none"));
    st.emplace_back(c10::List<c10::optional<at::Scalar>>());
    st.emplace_back(c10::IValue());
    op->callBoxed(&st);
    at::Tensor y = st.at(0).toTensor();  // channels-last: permuted back, it is dense (no copy)
    return (y.dim() == 5 ? y.permute({0, 2, 3, 4, 1}) : y.permute({0, 2, 3, 1})).contiguous();
  }
};

// dynamo's own F(2, 3) Winograd (winograd.h) for channels-last steps, which oneDNN's Winograd
// kernels do not take: 3x3 and 3x3x3 (and 1x3x3) kernels, stride 1, padding 1. The transformed
// weights are kept as derived.h says.
struct OwnWinograd {
  WinogradShape shape;
  std::vector<int64_t> out_shape;  // [N, spatial..., Cout]
  Derived<std::vector<std::vector<float>>> u;

  // Throws when F(2, 3) does not compute this convolution. a.x: the [N, C, ...] view.
  explicit OwnWinograd(const ConvArgs &a) {
    if (jit::fault_injected("own_winograd"))  // tests
      throw std::runtime_error("injected fault: no own Winograd");
    std::vector<int64_t> xs(a.x.sizes().begin(), a.x.sizes().end()), ws(a.w.sizes().begin(), a.w.sizes().end());
    std::string why = winograd_refusal(xs, ws, a.stride, a.padding, a.dilation, a.groups, &shape);
    if (!why.empty()) throw std::runtime_error(why);
    out_shape.assign(xs.begin(), xs.end());
    out_shape.erase(out_shape.begin() + 1);
    out_shape.push_back(ws[0]);
  }

  at::Tensor run(const ConvArgs &a, const uint64_t *version) {
    at::Tensor x = (a.x.dim() == 5 ? a.x.permute({0, 2, 3, 4, 1}) : a.x.permute({0, 2, 3, 1})).contiguous();
    std::optional<ContentKey> key;
    if (version) key = ContentKey::of(a.w, *version);
    const ParallelFor par = [](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &body) {
      at::parallel_for(0, n, grain, body);
    };
    auto w = u.get(key ? &*key : nullptr, [&] {
      at::Tensor wc = a.w.contiguous();
      return winograd_weights(shape, wc.data_ptr<float>(), par);
    });
    at::Tensor b = a.b.defined() ? a.b.contiguous() : at::Tensor();
    at::Tensor out = pooled(out_shape, at::kFloat);  // (from the pool: see OnednnConv::run)
    winograd_conv(shape, x.data_ptr<float>(), *w, b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<float>());
    return out;
  }
};

struct ConvStep {
  std::mutex mu;
  // The paths, also the index of t[]: LibTorch's kernel, oneDNN's direct kernel, oneDNN's
  // Winograd, LibTorch's oneDNN with the weight packed once (PackedConv: channels-last steps).
  enum Mode { Aten, OneDNN, Winograd, Packed, Timing } mode = Timing;
  static constexpr int kPaths = 4;
  std::string why_aten;      // set when oneDNN does not apply
  std::string why_not_wino;  // set when Winograd does not apply or was refused
  std::string why_not_packed;  // set when PackedConv does not apply
  std::string direct_failed;   // set when the system oneDNN failed (building or running) where another path stays
  int timed = 0;
  double t[kPaths] = {1e30, 1e30, 1e30, 1e30};
  // After the choice: the chosen side's fastest of its next kWatchCalls calls; a choice that
  // turns out 1.5x slower than another path measured switches once (two timed calls can
  // mislead: another thread pool asleep then, spinning later).
  int watched = 0;
  double t_watch = 1e30;
  // Chosen on its first timed call (oneDNN 1.5x faster than the rest then): LibTorch's time is
  // its first call's, which includes building its own oneDNN primitive. The last watched call
  // times LibTorch again, warm, before comparing: weights that change on every call (training:
  // the optimizer writes them between steps) cost oneDNN a reorder each call, 1-2 ms for
  // 512x512x3x3, which its first timed call hid behind LibTorch's set-up.
  bool at_once = false;

  int64_t groups = 1;
  bool nhwc = false;  // dynamo::conv_nhwc: input and result [N, H, W, C]
  // Built on first use, each once, under mu, before its flag is set: a step that starts from a
  // stored choice builds only the primitive it runs (a later process's first call pays no
  // Winograd kernel it does not use).
  std::unique_ptr<OnednnConv> direct, wino;  // wino: null where it does not apply
  std::unique_ptr<OwnWinograd> own_wino;     // channels-last steps' Winograd: null where it does not apply
  std::unique_ptr<PackedConv> packed;         // null where it does not apply
  std::atomic<bool> direct_built{false}, wino_tried{false}, packed_tried{false};
  double wino_setup = 0;  // seconds: building the Winograd primitive, plus its first call's extra
  double wino_first = 0;  // its first timed call

  // Builds what `mode` runs on (Timing: every path), once; throws when the system oneDNN's
  // direct kernel cannot be built and no other oneDNN path applies (a channels-last step keeps
  // LibTorch's oneDNN then: oneDNN 2.6 has no channels-last kernel for dilated convolutions).
  void build(const ConvArgs &a, Mode mode) {
    groups = a.groups;
    const char *no_wino = getenv("DYNAMO_CONV_WINOGRAD");
    if ((mode == Timing || mode == Winograd) && !wino_tried && nhwc) {
      if (no_wino && !strcmp(no_wino, "0")) {
        why_not_wino = "DYNAMO_CONV_WINOGRAD=0";
      } else {
        try {
          double t0 = now();
          own_wino = std::make_unique<OwnWinograd>(a);
          wino_setup = now() - t0;
        } catch (const std::exception &e) {
          why_not_wino = std::string("dynamo's Winograd: ") + e.what();
        }
      }
      wino_tried = true;
    }
    if ((mode == Timing || mode == Winograd) && !wino_tried) {
      if (!winograd_shape(a, nhwc)) {
        why_not_wino = "not a 3x3, stride 1, ungrouped 2-D convolution of multiples of 16 channels";
      } else {
        try {
          double t0 = now();
          wino = std::make_unique<OnednnConv>(a, dnnl::algorithm::convolution_winograd, nhwc);
          wino_setup = now() - t0;
        } catch (const std::exception &e) {
          why_not_wino = std::string("oneDNN has no Winograd kernel here: ") + e.what();
        }
      }
      wino_tried = true;
    }
    if ((mode == Timing || mode == Packed) && !packed_tried) {
      if (!nhwc) {
        why_not_packed = "not a channels-last step";
      } else {
        try {
          packed = std::make_unique<PackedConv>(a);
        } catch (const std::exception &e) {
          why_not_packed = e.what();
        }
      }
      packed_tried = true;
    }
    if ((mode == Timing || mode == OneDNN || (mode == Winograd && !wino && !own_wino) || (mode == Packed && !packed)) &&
        !direct_built) {
      try {
        direct = std::make_unique<OnednnConv>(a, dnnl::algorithm::convolution_direct, nhwc);
      } catch (const std::exception &e) {
        if (!packed || (mode != Timing && mode != Packed)) throw;
        direct_failed = std::string("oneDNN: ") + e.what();
      }
      direct_built = true;
    }
  }

  // The primitive `mode` runs on when it is built (Winograd: the direct kernel where oneDNN has
  // no Winograd one; Packed: see ready_packed), else null.
  OnednnConv *ready(Mode mode) const {
    if (mode == Winograd && wino_tried)
      return wino ? wino.get() : own_wino ? nullptr : direct_built ? direct.get() : nullptr;
    if (mode == Packed && packed_tried && !packed) return direct_built ? direct.get() : nullptr;
    if (mode == OneDNN && direct_built) return direct.get();
    return nullptr;
  }
  PackedConv *ready_packed(Mode mode) const { return mode == Packed && packed_tried ? packed.get() : nullptr; }
  OwnWinograd *ready_own(Mode mode) const { return mode == Winograd && wino_tried ? own_wino.get() : nullptr; }

  // The fastest path measured among those still allowed, and its time. Winograd must win by
  // kWinogradMargin (dynamo's own: kOwnWinogradMargin), and save its one-time cost (building its
  // kernel, transforming the weights on its first call: wino_setup) within kWinogradPayback
  // calls: oneDNN's rounds a little more, and
  // every later process pays that cost on its first call (resnet50's 64-channel steps: 45
  // against 58 us a call for ~2 ms each on the first).
  Mode fastest(double *best) const {
    Mode m = Aten;
    for (int k = OneDNN; k < kPaths; ++k)
      if (k != Winograd && t[k] < t[m]) m = Mode(k);
    const double margin = own_wino ? kOwnWinogradMargin : kWinogradMargin;
    if (t[Winograd] * margin < t[m] && (t[m] - t[Winograd]) * kWinogradPayback >= wino_setup) m = Winograd;
    *best = t[m];
    return m;
  }
};

std::shared_ptr<ConvStep> conv_step_for(const std::string &callee) {
  if (callee != "aten::convolution" && callee != "dynamo::conv_nhwc") return nullptr;
  auto s = std::make_shared<ConvStep>();
  s->nhwc = callee == "dynamo::conv_nhwc";
  // DYNAMO_CONV=onednn, winograd or aten skips the measurement (read when the entry is compiled).
  if (const char *env = getenv("DYNAMO_CONV")) {
    if (!strcmp(env, "onednn")) s->mode = ConvStep::OneDNN;
    if (!strcmp(env, "winograd")) s->mode = ConvStep::Winograd;  // where oneDNN has one; else the direct kernel
    if (!strcmp(env, "packed")) s->mode = ConvStep::Packed;      // channels-last steps; else the direct kernel
    if (!strcmp(env, "aten")) {
      s->mode = ConvStep::Aten;
      s->why_aten = "DYNAMO_CONV=aten";
    }
  }
  return s;
}

std::string conv_step_choice(const ConvStep &s) {
  switch (s.mode) {
    case ConvStep::OneDNN: return "onednn";
    case ConvStep::Winograd:  // (forced where none applies: the direct kernel)
      return s.wino_tried && !s.wino && !s.own_wino ? "onednn" : "winograd";
    case ConvStep::Packed: return s.packed_tried && !s.packed ? "onednn" : "packed";
    case ConvStep::Aten: return s.why_aten.empty() ? "aten" : "aten (" + s.why_aten + ")";
    default: return "timing";
  }
}

bool conv_step_choose(ConvStep &s, const std::string &choice) {
  std::lock_guard<std::mutex> g(s.mu);
  if (choice == "onednn") {
    s.mode = ConvStep::OneDNN;
  } else if (choice == "winograd") {
    s.mode = ConvStep::Winograd;  // the direct kernel if this process finds no Winograd kernel
  } else if (choice == "packed") {
    s.mode = ConvStep::Packed;  // the direct kernel if this process's LibTorch has no oneDNN
  } else if (choice == "aten") {
    s.mode = ConvStep::Aten;
    s.why_aten.clear();
  } else {
    return false;
  }
  s.watched = kWatchCalls;  // nothing measured here to compare with
  return true;
}

namespace {

const char *path_name(int m) {
  return m == ConvStep::Aten ? "aten" : m == ConvStep::OneDNN ? "onednn" : m == ConvStep::Packed ? "packed" : "winograd";
}

// max |got - want| <= tol * max |want| (false when either holds a NaN).
bool agrees(const at::Tensor &got, const at::Tensor &want, double tol) {
  if (jit::fault_injected("winograd_result")) return false;  // tests: a result that disagrees
  double scale = want.abs().max().item<double>();
  double err = (got - want).abs().max().item<double>();
  return err <= tol * scale;
}

}  // namespace

void run_conv(ConvStep &s, const torch::jit::Stack &st, const uint64_t *weight_version,
              const std::function<at::Tensor()> &aten, at::Tensor *out) {
  ConvStep::Mode mode;
  bool watch;
  {
    std::lock_guard<std::mutex> g(s.mu);
    mode = s.mode;
    int measured = 0;
    for (double v : s.t) measured += v < 1e30;
    watch = s.watched < kWatchCalls && measured >= 2;
  }
  double t0 = watch ? now() : 0;
  // The end of a watched call (see ConvStep::watched).
  auto watched = [&] {
    double t = now() - t0;
    bool retime = false;
    {
      std::lock_guard<std::mutex> g(s.mu);
      if (s.mode != mode) return;  // switched meanwhile (a oneDNN failure)
      s.t_watch = std::min(s.t_watch, t);
      if (s.watched + 1 < kWatchCalls) {
        ++s.watched;
        return;
      }
      retime = s.at_once && mode != ConvStep::Aten;
    }
    if (retime) {  // (see ConvStep::at_once; its result is dropped: the chosen path's stands)
      double t1 = now();
      try {
        (void)aten();
        double ta = now() - t1;
        std::lock_guard<std::mutex> g(s.mu);
        s.t[ConvStep::Aten] = ta;
        if (getenv("DYNAMO_PRINT_CHOICES"))
          fprintf(stderr, "conv %s: LibTorch timed again warm: %.1f us (the choice's %d calls: %.1f us at best)\n",
                  path_name(mode), ta * 1e6, kWatchCalls, s.t_watch * 1e6);
      } catch (const std::exception &) {
      }
    }
    std::lock_guard<std::mutex> g(s.mu);
    if (s.mode != mode || s.watched >= kWatchCalls) return;  // (another thread finished the watch)
    ++s.watched;
    double mine = s.t[mode];
    s.t[mode] = 1e30;  // the best of the others
    double other;
    ConvStep::Mode alt = s.fastest(&other);
    s.t[mode] = mine;
    // (LibTorch timed again just now, warm, once: that single time against the choice's best of
    // kWatchCalls leans towards the choice already, so a smaller margin decides)
    if (s.t_watch > (retime && alt == ConvStep::Aten ? 1.1 : 1.5) * other) {
      s.mode = alt;
      if (alt != ConvStep::Winograd && s.own_wino) s.own_wino->u.clear();
      if (getenv("DYNAMO_PRINT_CHOICES"))
        fprintf(stderr, "conv switched to %s: its %d calls took %.1f us at best, %s measured %.1f us\n",
                path_name(alt), kWatchCalls, s.t_watch * 1e6, path_name(alt), other * 1e6);
    }
  };
  if (mode == ConvStep::Aten) {
    *out = aten();
    if (watch) watched();
    return;
  }
  // oneDNN failing at run time (it should not): this step uses LibTorch from now on.
  // `who` (an OnednnConv or a PackedConv) runs the call, or LibTorch does when it throws.
  auto run_or_aten = [&](auto &who, const ConvArgs &a, const char *what) {
    try {
      *out = who.run(a, weight_version);
    } catch (const std::exception &e) {
      std::lock_guard<std::mutex> g(s.mu);
      s.mode = ConvStep::Aten;
      s.why_aten = std::string(what) + ": " + e.what();
      *out = aten();
    }
  };
  auto onednn_or_aten = [&](OnednnConv &c, const ConvArgs &a) { run_or_aten(c, a, "oneDNN"); };
  auto packed_or_aten = [&](PackedConv &p, const ConvArgs &a) { run_or_aten(p, a, "LibTorch's oneDNN"); };
  auto own_or_aten = [&](OwnWinograd &w, const ConvArgs &a) { run_or_aten(w, a, "dynamo's Winograd"); };
  ConvArgs a;
  // A path built already: the arguments were checked then (a trace's shapes are static).
  PackedConv *packed = s.ready_packed(mode);
  OwnWinograd *own = packed ? nullptr : s.ready_own(mode);
  OnednnConv *prim = packed || own ? nullptr : s.ready(mode);
  if (packed || own || prim) {
    a.x = s.nhwc ? nchw_view(st[0].toTensor()) : st[0].toTensor();
    a.w = st[1].toTensor();
    if (st[2].isTensor()) a.b = st[2].toTensor();
    a.groups = s.groups;
    if (packed) packed_or_aten(*packed, a);
    else if (own) own_or_aten(*own, a);
    else onednn_or_aten(*prim, a);
    if (watch) watched();
    return;
  }
  std::string why = parse(st, s.nhwc, &a);
  try {
    if (why.empty()) {
      std::lock_guard<std::mutex> g(s.mu);
      s.build(a, mode);
    }
  } catch (const std::exception &e) {
    why = std::string("oneDNN: ") + e.what();
  }
  if (!why.empty()) {
    std::lock_guard<std::mutex> g(s.mu);
    s.mode = ConvStep::Aten;
    s.why_aten = why;
    *out = aten();
    return;
  }
  if (mode != ConvStep::Timing) {
    if (PackedConv *p = s.ready_packed(mode)) {
      packed_or_aten(*p, a);
    } else if (OwnWinograd *w = s.ready_own(mode)) {
      own_or_aten(*w, a);
    } else if (OnednnConv *c = s.ready(mode)) {
      onednn_or_aten(*c, a);
    } else {  // (a forced path this step has no primitive for)
      std::lock_guard<std::mutex> g(s.mu);
      s.mode = ConvStep::Aten;
      s.why_aten = s.direct_failed.empty() ? "no oneDNN primitive" : s.direct_failed;
      *out = aten();
    }
    return;
  }
  // Timing: every path that applies, the fastest one's result returned (they agree within
  // rounding; Winograd's is checked against LibTorch's and refused for this step when it does
  // not). The order rotates between the timed calls: whichever runs later can find the other's
  // threads still spinning (OpenBLAS after LibTorch's GEMM, OpenMP after oneDNN) and lose for
  // that alone.
  constexpr int kPaths = ConvStep::kPaths;
  int first;
  bool try_wino, try_packed, try_direct;
  {
    std::lock_guard<std::mutex> g(s.mu);
    first = s.timed % kPaths;
    try_direct = s.direct && s.direct_failed.empty();
    try_wino = s.own_wino ? s.why_not_wino.empty() : s.wino && s.why_not_wino.empty() && s.direct_failed.empty();
    try_packed = s.packed && s.why_not_packed.empty();
  }
  at::Tensor got[kPaths];
  double took[kPaths] = {1e30, 1e30, 1e30, 1e30};
  std::string dnnl_failed, packed_failed, own_failed;
  for (int i = 0; i < kPaths; ++i) {
    int m = (first + i) % kPaths;
    if ((m == ConvStep::Winograd && !try_wino) || (m == ConvStep::Packed && !try_packed) ||
        (m == ConvStep::OneDNN && !try_direct))
      continue;
    double t1 = now();
    if (m == ConvStep::Aten) {
      got[m] = aten();
    } else if (m == ConvStep::Packed) {
      try {
        got[m] = s.packed->run(a, weight_version);
      } catch (const std::exception &e) {
        packed_failed = e.what();
        continue;
      }
    } else if (m == ConvStep::Winograd && s.own_wino) {
      try {
        got[m] = s.own_wino->run(a, weight_version);
      } catch (const std::exception &e) {
        own_failed = e.what();
        continue;
      }
    } else {
      try {
        got[m] = (m == ConvStep::Winograd ? *s.wino : *s.direct).run(a, weight_version);
      } catch (const std::exception &e) {
        if (dnnl_failed.empty()) dnnl_failed = e.what();
        continue;
      }
    }
    took[m] = now() - t1;
  }
  std::string refused;
  if (got[ConvStep::Winograd].defined() && !agrees(got[ConvStep::Winograd], got[ConvStep::Aten], kWinogradTolerance))
    refused = "its result differs from LibTorch's by more than " + std::to_string(kWinogradTolerance) +
              " of the largest output";
  std::lock_guard<std::mutex> g(s.mu);
  if (!packed_failed.empty()) s.why_not_packed = "LibTorch's oneDNN: " + packed_failed;  // (the others still time)
  if (!own_failed.empty()) s.why_not_wino = "dynamo's Winograd: " + own_failed;
  if (!dnnl_failed.empty()) {
    if (!try_packed || !packed_failed.empty()) {  // (no oneDNN path left)
      s.mode = ConvStep::Aten;
      s.why_aten = "oneDNN: " + dnnl_failed;
      *out = got[ConvStep::Aten];
      return;
    }
    s.direct_failed = "oneDNN: " + dnnl_failed;  // LibTorch's oneDNN and LibTorch's call stay
    s.t[ConvStep::OneDNN] = s.t[ConvStep::Winograd] = took[ConvStep::OneDNN] = took[ConvStep::Winograd] = 1e30;
  }
  if (took[ConvStep::Winograd] < 1e30) {  // its first call transforms the weights: that time is setup
    if (s.t[ConvStep::Winograd] >= 1e30) s.wino_first = took[ConvStep::Winograd];
    else s.wino_setup += std::max(0.0, s.wino_first - std::min(s.t[ConvStep::Winograd], took[ConvStep::Winograd]));
  }
  for (int m = 0; m < kPaths; ++m) s.t[m] = std::min(s.t[m], took[m]);
  if (!refused.empty()) {
    s.why_not_wino = refused;
    s.t[ConvStep::Winograd] = 1e30;
  }
  double best;
  ConvStep::Mode m = s.fastest(&best);
  // oneDNN's first call also reorders the weights: when oneDNN wins that one by 1.5x over
  // every other it is kept at once; otherwise a second call (weights kept) decides (LibTorch
  // never wins at once: oneDNN's reorder can take 15x its convolution, 2 ms for 512x512x3x3).
  // Winograd's first call also transforms the weights (65 ms for 512x512x3x3) and touches its
  // large scratchpad for the first time: a step where it applies always takes the second call.
  bool clear = m != ConvStep::Aten && !(s.timed == 0 && (s.wino || s.own_wino) && s.why_not_wino.empty());
  for (int k = 0; k < kPaths; ++k)
    if (k != m && s.t[k] < 1e30 && best * 1.5 >= s.t[k]) clear = false;
  if (++s.timed >= kTimedCalls || clear) {
    s.mode = m;
    s.at_once = s.timed < kTimedCalls;
    if (m != ConvStep::Winograd && s.own_wino) s.own_wino->u.clear();  // (its weights: up to 4 MB)
    if (getenv("DYNAMO_PRINT_CHOICES"))
      fprintf(stderr, "conv %s: onednn %.1f us, winograd %s, packed %s, aten %.1f us (src %s)\n",
              conv_step_choice(s).c_str(), s.t[ConvStep::OneDNN] * 1e6,
              s.t[ConvStep::Winograd] < 1e30 ? (std::to_string(s.t[ConvStep::Winograd] * 1e6) + " us").c_str()
                                              : ("- (" + s.why_not_wino + ")").c_str(),
              s.t[ConvStep::Packed] < 1e30 ? (std::to_string(s.t[ConvStep::Packed] * 1e6) + " us").c_str()
                                            : ("- (" + s.why_not_packed + ")").c_str(),
              s.t[ConvStep::Aten] * 1e6, c10::str(a.x.sizes()).c_str());
  }
  *out = got[m];
}

}  // namespace dynamo::runtime

