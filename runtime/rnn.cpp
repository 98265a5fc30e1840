// rnn.cpp -- dynamo::rnn_layer: aten::mkldnn_rnn_layer (how torch 2.x runs one layer and
// direction of nn.LSTM on the CPU, through oneDNN) without its fourth result, the workspace,
// which is undefined in inference: a trace's extern must name tensors only. The recorder
// records the layer as this op (recorder._rnn_layer), so an LSTM stays inside one trace at
// oneDNN's speed.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Result rnn_layer_cpu(const at::Tensor &input, const at::Tensor &w_ih, const at::Tensor &w_hh, const at::Tensor &b_ih,
                     const at::Tensor &b_hh, const at::Tensor &hx, const at::Tensor &cx, bool reverse,
                     at::IntArrayRef batch_sizes, int64_t mode, int64_t hidden_size, int64_t num_layers,
                     bool has_biases, bool bidirectional, bool batch_first, bool train) {
  auto r = at::mkldnn_rnn_layer(input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size,
                                num_layers, has_biases, bidirectional, batch_first, train);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

Result rnn_layer_meta(const at::Tensor &input, const at::Tensor &w_ih, const at::Tensor &w_hh, const at::Tensor &b_ih,
                      const at::Tensor &b_hh, const at::Tensor &hx, const at::Tensor &cx, bool reverse,
                      at::IntArrayRef batch_sizes, int64_t mode, int64_t hidden_size, int64_t num_layers,
                      bool has_biases, bool bidirectional, bool batch_first, bool train) {
  TORCH_CHECK(input.dim() == 3, "dynamo::rnn_layer: input must be [steps, batch, features]");
  auto out = at::empty({input.size(0), input.size(1), hidden_size}, input.options());
  return {out, at::empty_like(hx), at::empty_like(cx)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dynamo, m) {
  m.def("rnn_layer(Tensor input, Tensor w_ih, Tensor w_hh, Tensor b_ih, Tensor b_hh, Tensor hx, Tensor cx, "
        "bool reverse, int[] batch_sizes, int mode, int hidden_size, int num_layers, bool has_biases, "
        "bool bidirectional, bool batch_first, bool train) -> (Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(dynamo, CPU, m) { m.impl("rnn_layer", &rnn_layer_cpu); }
TORCH_LIBRARY_IMPL(dynamo, Meta, m) { m.impl("rnn_layer", &rnn_layer_meta); }
