// onednn_conv.h -- aten::convolution (1-3 spatial dims, float32, not transposed) through oneDNN,
// the library LibTorch itself uses only for some shapes: at batch 1 with small images LibTorch
// takes its im2col + GEMM path (thnn), several times slower than oneDNN's direct kernels.
// One ConvStep per extern step of an entry: the primitive is built once (shapes are static in a
// trace), and the step times LibTorch, oneDNN's direct kernel and (3x3, stride 1) a Winograd
// kernel -- oneDNN's, or dynamo's own for channels-last steps (winograd.h) -- on its first calls
// and keeps the fastest (DYNAMO_CONV=onednn, winograd or aten, read when an entry is compiled,
// decides instead; DYNAMO_CONV_WINOGRAD=0 leaves Winograd out).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include <functional>
#include <memory>
#include <string>

namespace dynamo::runtime {

struct ConvStep;

// A ConvStep for an extern step calling `callee`, or null when the callee is not a convolution:
// aten::convolution, or dynamo::conv_nhwc (runtime/channels_last_ops.cpp: input and result [N, H, W, C], the
// trace's channels-last form of a 2-D convolution, jit/layout.cpp; arguments input, weight,
// bias?, stride, padding, dilation, groups), whose oneDNN primitive reads and writes
// channels-last with no reorder.
std::shared_ptr<ConvStep> conv_step_for(const std::string &callee);

// Computes the convolution whose boxed arguments are `st` into *out, by oneDNN or by `aten`
// (LibTorch's kernel), whichever this step measured faster. weight_version: the caller's write
// count of the weight (dynamo_versioned_tensor), or null; with it, the weight's reordered copy
// is reused while address, version and a sample of the contents stay the same. Throws what
// either path throws.
void run_conv(ConvStep &s, const torch::jit::Stack &st, const uint64_t *weight_version,
              const std::function<at::Tensor()> &aten, at::Tensor *out);

// What the step chose, for logs and tests: "onednn" (the direct kernel), "winograd", "packed"
// (LibTorch's oneDNN with the weight packed once: channels-last steps), "aten",
// "timing" (not decided yet), or "aten (why oneDNN does not apply)".
std::string conv_step_choice(const ConvStep &s);

// Sets the step's path as a measurement made earlier (another process) chose it: "onednn",
// "winograd" (the direct kernel where this process's oneDNN has none), "packed" (likewise where
// this LibTorch has no oneDNN) or "aten"; false for any
// other text. A oneDNN step that then fails still falls back to LibTorch.
bool conv_step_choose(ConvStep &s, const std::string &choice);

}  // namespace dynamo::runtime
