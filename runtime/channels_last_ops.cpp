// channels_last_ops.cpp -- the ops jit/layout.cpp puts into traces whose convolution chains run
// channels-last: each takes and returns [N, H, W, C] tensors (dense, C innermost; conv_nhwc also
// [N, D, H, W, C]) and computes what its ATen namesake computes on the [N, C, H, W] view of them.
// The extern steps call them through the dispatcher like any ATen op; dynamo::conv_nhwc's steps
// go to oneDNN first (runtime/onednn_conv.cpp) and come here for their LibTorch path.
//
// LibTorch runs a channels-last [N, C, H, W] tensor through its channels-last kernels (oneDNN's
// for convolutions) and returns a channels-last result, so permuting that back to [N, H, W, C]
// is a view of dense memory and `.contiguous()` copies nothing (it copies where a kernel returns
// another layout: correct either way).
#include <ATen/ATen.h>
#include <torch/library.h>

namespace dynamo::runtime {

namespace {

at::Tensor nchw(const at::Tensor &x, const char *op, bool three_d = false) {
  TORCH_CHECK(x.dim() == 4 || (three_d && x.dim() == 5), "dynamo::", op, ": the input must be [N, H, W, C]",
              three_d ? " or [N, D, H, W, C]" : "", ", got ", x.dim(), " dimensions");
  return x.dim() == 5 ? x.permute({0, 4, 1, 2, 3}) : x.permute({0, 3, 1, 2});
}

at::Tensor nhwc(const at::Tensor &y) {
  return (y.dim() == 5 ? y.permute({0, 2, 3, 4, 1}) : y.permute({0, 2, 3, 1})).contiguous();
}

at::Tensor conv_nhwc(const at::Tensor &x, const at::Tensor &w, const c10::optional<at::Tensor> &b,
                     at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  std::vector<int64_t> no_output_padding(stride.size(), 0);
  return nhwc(at::convolution(nchw(x, "conv_nhwc", true), w, b, stride, padding, dilation, false, no_output_padding,
                              groups));
}

at::Tensor max_pool2d_nhwc(const at::Tensor &x, at::IntArrayRef kernel, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  return nhwc(at::max_pool2d(nchw(x, "max_pool2d_nhwc"), kernel, stride, padding, dilation, ceil_mode));
}

at::Tensor avg_pool2d_nhwc(const at::Tensor &x, at::IntArrayRef kernel, at::IntArrayRef stride,
                           at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                           c10::optional<int64_t> divisor) {
  return nhwc(at::avg_pool2d(nchw(x, "avg_pool2d_nhwc"), kernel, stride, padding, ceil_mode, count_include_pad, divisor));
}

}  // namespace

}  // namespace dynamo::runtime

// (Each is CompositeExplicitAutograd over ATen calls, so meta and fake tensors work too.)
TORCH_LIBRARY_FRAGMENT(dynamo, m) {
  m.def("conv_nhwc(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups) -> Tensor");
  m.def("max_pool2d_nhwc(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, "
        "bool ceil_mode=False) -> Tensor");
  m.def("avg_pool2d_nhwc(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, "
        "bool count_include_pad=True, int? divisor_override=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(dynamo, CompositeExplicitAutograd, m) {
  m.impl("conv_nhwc", &dynamo::runtime::conv_nhwc);
  m.impl("max_pool2d_nhwc", &dynamo::runtime::max_pool2d_nhwc);
  m.impl("avg_pool2d_nhwc", &dynamo::runtime::avg_pool2d_nhwc);
}
