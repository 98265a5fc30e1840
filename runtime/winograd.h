// winograd.h -- channels-last float32 convolutions by Winograd's minimal filtering F(2, 3)
// along every spatial dim whose kernel is 3 wide (runtime/winograd.cpp). For a 3x3x3 kernel
// a 2x2x2 block of outputs takes 64 multiplications per input/output channel pair instead of
// 216 (3.4x fewer; 3x3: 2.25x), as 64 independent GEMMs over tiles x channels plus cheap
// add/subtract transforms -- the only way past the FMA peak the direct kernels already reach
// on the two cores here (r3d_18's 3x3x3 convolutions). The rounding differs from a direct
// convolution's by a few ulps of the output's magnitude (onednn_conv.cpp checks each step's
// result against LibTorch's before it uses this path).
#pragma once

#include "gemm.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dynamo::runtime {

// One convolution's static shape: batch, spatial dims (1-3; those before a 2-D one's are 1),
// kernel per dim (1 or 3), channels.
struct WinogradShape {
  int64_t n = 1, in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, cin = 0, cout = 0;
  int64_t positions() const;  // 4 per dim of kernel 3, 1 per dim of kernel 1
};

// Why F(2, 3) does not compute this convolution, or "" when it does: float32, ungrouped, stride
// 1, undilated, every kernel dim 1 (padding 0) or 3 (padding 1: the output as large as the
// input), at least two dims of 3 (one gives 1.5x fewer multiplications, less than the
// transforms cost). sizes: input [N, C, spatial...] and weight [Cout, Cin, k...].
std::string winograd_refusal(const std::vector<int64_t> &x_sizes, const std::vector<int64_t> &w_sizes,
                             const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                             const std::vector<int64_t> &dilation, int64_t groups, WinogradShape *shape);

// The weights transformed (G g G^T along each dim of 3) and packed for sgemm_prepacked: one
// Cin x Cout matrix per position. w: [Cout, Cin, k...] contiguous.
std::vector<std::vector<float>> winograd_weights(const WinogradShape &s, const float *w, const ParallelFor &par);

// y [N, spatial..., Cout] = the convolution of x [N, spatial..., Cin] (both dense channels-last)
// with the transformed weights u, plus bias (Cout floats, or null).
void winograd_conv(const WinogradShape &s, const float *x, const std::vector<std::vector<float>> &u,
                   const float *bias, float *y);

}  // namespace dynamo::runtime
