// One decoder layer's step of up to 16 rows (a decoding step or a draft tree) in one call: what the packed
// verifier's Python layer loop does around the GGUF products (rest_lsp/model/decode_layer.py says why and when),
// the same operations in the same order, so a row gets the bits the Python loop gives it. Built into the
// gguf_amx extension (gguf_amx.cpp's `gguf_product`); the tree attention is attention.cpp's, called through the
// address the Python side hands over.
#include <torch/extension.h>
#include <cmath>
#include <cstdint>
#include <vector>

// gguf_amx.cpp: one product of the kernel's formats (0 Q4_K, 1 Q6_K, 2 Q5_0, 3 Q8_0) -> [M, N] fp32
torch::Tensor gguf_product(int64_t kind, const torch::Tensor& x, const std::vector<torch::Tensor>& blocks);

namespace {

using AttendFn = int (*)(const float*, const float*, const float*, int64_t, const uint8_t*, int, int, int, int, int,
                         float, float*);

// a layer's product over one input: its parts' outputs side by side, each with its own bias (what the Python
// side's fused Int4WeightLinear or Parts gives)
struct Linear {
  std::vector<int64_t> kinds;
  std::vector<std::vector<torch::Tensor>> blocks;
  std::vector<torch::Tensor> biases;  // an empty tensor: no bias
  std::vector<int64_t> widths;
  int64_t out = 0;

  Linear(std::vector<int64_t> k, std::vector<std::vector<torch::Tensor>> b, std::vector<torch::Tensor> bias,
         std::vector<int64_t> w)
      : kinds(std::move(k)), blocks(std::move(b)), biases(std::move(bias)), widths(std::move(w)) {
    TORCH_CHECK(!kinds.empty() && kinds.size() == blocks.size() && kinds.size() == biases.size() &&
                    kinds.size() == widths.size(), "decode layer: a product's parts");
    for (int64_t w : widths) out += w;
  }

  torch::Tensor operator()(const torch::Tensor& x) const {
    if (kinds.size() == 1) {
      torch::Tensor y = gguf_product(kinds[0], x, blocks[0]);
      if (biases[0].numel()) y.add_(biases[0]);
      return y;
    }
    torch::Tensor y = torch::empty({x.size(0), out}, torch::kFloat32);
    int64_t at = 0;
    for (size_t i = 0; i < kinds.size(); ++i) {
      torch::Tensor part = gguf_product(kinds[i], x, blocks[i]);
      if (biases[i].numel()) part.add_(biases[i]);
      y.narrow(1, at, widths[i]).copy_(part);
      at += widths[i];
    }
    return y;
  }
};

// ops.rope, element by element: x*cos + rotate_half(x)*sin, each product rounded before the sum as torch's three
// operations round them (no fused multiply-add: the bits must be the Python path's)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void rope_row(const float* x, const float* cos, const float* sin, int64_t hd, float* out) {
  const int64_t h = hd / 2;
  for (int64_t d = 0; d < h; ++d) {
    const float a = x[d] * cos[d], b = -x[d + h] * sin[d];
    out[d] = a + b;
  }
  for (int64_t d = h; d < hd; ++d) {
    const float a = x[d] * cos[d], b = x[d - h] * sin[d];
    out[d] = a + b;
  }
}
#pragma GCC pop_options

class DecodeLayer {
 public:
  DecodeLayer(torch::Tensor in_norm, torch::Tensor post_norm, double eps, Linear qkv, Linear o, Linear mlp_in,
              Linear down, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t attend)
      : in_norm_(std::move(in_norm)), post_norm_(std::move(post_norm)), eps_(eps), qkv_(std::move(qkv)),
        o_(std::move(o)), mlp_in_(std::move(mlp_in)), down_(std::move(down)), nh_(heads), nkv_(kv_heads),
        hd_(head_dim), attend_(reinterpret_cast<AttendFn>(attend)),
        scale_(static_cast<float>(std::pow(static_cast<double>(head_dim), -0.5))) {
    TORCH_CHECK(qkv_.out == (nh_ + 2 * nkv_) * hd_ && mlp_in_.out % 2 == 0 && hd_ % 2 == 0 && nh_ % nkv_ == 0,
                "decode layer: shapes");
  }

  // x [q, D] fp32; cos, sin [q, hd] fp32; cache [L, 2, nkv, max_len, hd] fp32, layer `layer` written at `slots`
  // [q]; mask [q, span] bool -> the layer's output [q, D]
  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     const torch::Tensor& cache, int64_t layer, const torch::Tensor& slots,
                     const torch::Tensor& mask) const {
    const int64_t q = x.size(0), D = x.size(1), span = mask.size(1), max_len = cache.size(3);
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32 && q >= 1, "decode layer: x");
    TORCH_CHECK(cache.is_contiguous() && cache.scalar_type() == torch::kFloat32 && cache.dim() == 5 &&
                    cache.size(1) == 2 && cache.size(2) == nkv_ && cache.size(4) == hd_ && layer >= 0 &&
                    layer < cache.size(0), "decode layer: cache");
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == q && cos.size(1) == hd_ &&
                    sin.sizes() == cos.sizes() && cos.scalar_type() == torch::kFloat32 &&
                    sin.scalar_type() == torch::kFloat32, "decode layer: rotary tables");
    TORCH_CHECK(slots.is_contiguous() && slots.scalar_type() == torch::kLong && slots.size(0) == q,
                "decode layer: slots");
    TORCH_CHECK(mask.is_contiguous() && mask.scalar_type() == torch::kBool && mask.size(0) == q &&
                    span <= max_len, "decode layer: mask");
    const int64_t* sl = slots.data_ptr<int64_t>();
    for (int64_t r = 0; r < q; ++r) TORCH_CHECK(sl[r] >= 0 && sl[r] < span, "decode layer: a slot past the span");

    const torch::Tensor qkv = qkv_(at::rms_norm(x, {D}, in_norm_, eps_));  // [q, (nh + 2 nkv) hd]
    const float* p = qkv.data_ptr<float>();
    const float* c = cos.data_ptr<float>();
    const float* s = sin.data_ptr<float>();
    float* kc = cache.data_ptr<float>() + layer * 2 * nkv_ * max_len * hd_;
    float* vc = kc + nkv_ * max_len * hd_;
    const int64_t width = (nh_ + 2 * nkv_) * hd_;
    torch::Tensor qr = torch::empty({nh_, q, hd_}, torch::kFloat32);
    float* qp = qr.data_ptr<float>();
    for (int64_t r = 0; r < q; ++r) {
      const float* row = p + r * width;
      for (int64_t h = 0; h < nh_; ++h) rope_row(row + h * hd_, c + r * hd_, s + r * hd_, hd_, qp + (h * q + r) * hd_);
      for (int64_t g = 0; g < nkv_; ++g) {
        const int64_t at = (g * max_len + sl[r]) * hd_;
        rope_row(row + (nh_ + g) * hd_, c + r * hd_, s + r * hd_, hd_, kc + at);
        std::memcpy(vc + at, row + (nh_ + nkv_ + g) * hd_, hd_ * sizeof(float));
      }
    }
    torch::Tensor att = torch::empty({nh_, q, hd_}, torch::kFloat32);
    const int rc = attend_(qp, kc, vc, max_len * hd_, reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>()),
                           int(nh_), int(nkv_), int(q), int(span), int(hd_), scale_, att.data_ptr<float>());
    TORCH_CHECK(rc == 0, "decode layer: the tree attention refused its arguments");
    // [nh, q, hd] -> [q, nh hd]
    torch::Tensor rows = torch::empty({q, nh_ * hd_}, torch::kFloat32);
    const float* ap = att.data_ptr<float>();
    float* rp = rows.data_ptr<float>();
    for (int64_t h = 0; h < nh_; ++h)
      for (int64_t r = 0; r < q; ++r) std::memcpy(rp + (r * nh_ + h) * hd_, ap + (h * q + r) * hd_, hd_ * sizeof(float));

    torch::Tensor mid = o_(rows);
    mid.add_(x);  // x + o(...): the same sum
    const torch::Tensor up = mlp_in_(at::rms_norm(mid, {D}, post_norm_, eps_));  // [q, 2 I]: gate, up
    const int64_t inner = up.size(1) / 2;
    torch::Tensor act = at::silu(up.narrow(1, 0, inner));
    act.mul_(up.narrow(1, inner, inner));
    torch::Tensor out = down_(act);
    out.add_(mid);
    return out;
  }

 private:
  torch::Tensor in_norm_, post_norm_;
  double eps_;
  Linear qkv_, o_, mlp_in_, down_;
  int64_t nh_, nkv_, hd_;
  AttendFn attend_;
  float scale_;
};

}  // namespace

void bind_decode_layer(pybind11::module& m) {
  pybind11::class_<Linear>(m, "GgufLinear")
      .def(pybind11::init<std::vector<int64_t>, std::vector<std::vector<torch::Tensor>>, std::vector<torch::Tensor>,
                          std::vector<int64_t>>(),
           "kinds, blocks, biases (empty: none), output widths: parts side by side")
      .def("__call__", &Linear::operator(), "x [M, K] fp32 -> [M, N] fp32");
  pybind11::class_<DecodeLayer>(m, "DecodeLayer")
      .def(pybind11::init<torch::Tensor, torch::Tensor, double, Linear, Linear, Linear, Linear, int64_t, int64_t,
                          int64_t, int64_t>(),
           "in_norm, post_norm, eps, qkv, o, mlp_in, down, heads, kv_heads, head_dim, attention kernel address")
      .def("step", &DecodeLayer::step, "x, cos, sin, cache, layer, slots, mask -> x");
}
