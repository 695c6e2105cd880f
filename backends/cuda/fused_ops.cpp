// The cuda backend's fused elementwise pairs (Backend::binary_unary, Backend::compare_select):
// one kernel from fused_kernels.cu where the walk merges to at most two dimensions and the dtypes
// are float32/float64; otherwise the default (the two kernels through a temporary). And its fused
// chains (Backend::elementwise_chain, MESHRT_CUDA_FUSION=chains): chain_kernels.cu's interpreter
// where the chain fits its limits; otherwise the default (the ops through temporaries).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "backends/cuda/chain_kernels.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fused_kernels.h"
#include "backends/merge_dims.h"
#include "backends/scalar_ops.h"

namespace meshrt::cuda {
namespace {

// The (rows, cols) walk of `shape` and each operand's two strides, or nothing past rank 2.
struct Walk {
  int64_t rows = 1, cols = 1;
  std::vector<Operand2> ops;
};
std::optional<Walk> walk2(const std::vector<int64_t>& shape,
                          const std::vector<const backend::Strided*>& in) {
  std::vector<const std::vector<int64_t>*> strides;
  for (const backend::Strided* s : in) strides.push_back(&s->strides);
  const backend::MergedDims m = backend::merge_dims(shape, strides);
  if (m.size.size() > 2) return std::nullopt;
  Walk w;
  const size_t r = m.size.size();
  if (r >= 1) w.cols = m.size[r - 1];
  if (r == 2) w.rows = m.size[0];
  for (size_t i = 0; i < in.size(); ++i) {
    Operand2 o;
    o.data = in[i]->data;
    if (r >= 1) o.s1 = m.strides[i][r - 1];
    if (r == 2) o.s0 = m.strides[i][0];
    w.ops.push_back(o);
  }
  return w;
}

bool fusable(DType t) { return t == DType::f32 || t == DType::f64; }

bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || is_half(t); }

// `value` stored as `t` the way the fill kernel stores it (scalar::convert, on the host), as the
// low bits of a word.
uint64_t fill_bits(DType t, double value) {
  uint64_t bits = 0;
  backend::scalar::visit_any_dtype(t, [&](auto v) {
    const auto stored = backend::scalar::convert<decltype(v)>(value);
    static_assert(sizeof(stored) <= sizeof(bits));
    std::memcpy(&bits, &stored, sizeof(stored));
  });
  return bits;
}

// The chain as chain_kernels.h's launch (inputs' data and strides aside: they come with each call),
// or nothing where the kernel does not take it: more inputs, ops or values live at once than it
// has room for, or an op its single-op launcher would refuse (an integer division, a unary op other
// than astype between dtypes, a result dtype the op does not give). Values get register-file slots
// by liveness: an op's result may take the slot of a source it reads for the last time; an output
// keeps its slot to the end, when the outputs are stored.
std::optional<ChainLaunch> plan_chain(const backend::ElementwiseChain& chain) {
  using Kind = backend::ChainOp::Kind;
  const int ni = chain.inputs;
  const int nops = static_cast<int>(chain.ops.size());
  const auto nout = static_cast<int>(chain.output_count());
  if (ni < 0 || ni > kChainMaxInputs || static_cast<int>(chain.input_dtypes.size()) != ni ||
      nops < 1 || nops > kChainMaxOps || nout > kChainMaxOutputs) {
    return std::nullopt;
  }
  std::vector<int> last_use(static_cast<size_t>(ni + nops), -1);
  ChainLaunch c;
  c.inputs = ni;
  c.ops = nops;
  c.outputs = nout;
  for (int i = 0; i < nops; ++i) {
    const backend::ChainOp& o = chain.ops[static_cast<size_t>(i)];
    const int nsrc = o.reads();
    DType src[3] = {};
    for (int j = 0; j < nsrc; ++j) {
      if (o.src[j] < 0 || o.src[j] >= ni + i) return std::nullopt;  // not yet computed
      last_use[static_cast<size_t>(o.src[j])] = i;
      src[j] = chain.value_dtype(o.src[j]);
    }
    ChainStep& s = c.step[i];
    s.kind = o.kind == Kind::unary    ? kChainUnary
             : o.kind == Kind::binary ? kChainBinary
             : o.kind == Kind::select ? kChainSelect
                                      : kChainConstant;
    s.op = static_cast<uint8_t>(o.op);
    s.in = static_cast<uint8_t>(o.in);
    s.out = static_cast<uint8_t>(o.out);
    switch (o.kind) {
      case Kind::unary:
        if (o.op < backend::code(backend::UnaryOp::copy) ||
            o.op > backend::code(backend::UnaryOp::relu) || src[0] != o.in ||
            (o.op != backend::code(backend::UnaryOp::copy) && o.in != o.out)) {
          return std::nullopt;
        }
        break;
      case Kind::binary: {
        if (o.op < backend::code(backend::BinaryOp::add) ||
            o.op > backend::code(backend::BinaryOp::ge) || src[0] != o.in || src[1] != o.in) {
          return std::nullopt;
        }
        const auto op = static_cast<backend::BinaryOp>(o.op);
        if (o.out != (backend::is_comparison(op) ? DType::bool_ : o.in)) return std::nullopt;
        if (op == backend::BinaryOp::div && !is_float(o.in)) return std::nullopt;
        break;
      }
      case Kind::select:
        if (src[0] != DType::bool_ || src[1] != o.out || src[2] != o.out || o.in != o.out)
          return std::nullopt;
        break;
      case Kind::constant:
        s.bits = fill_bits(o.out, o.value);
        s.in = s.out;
        break;
    }
  }
  // Outputs are stored after the last op: their slots live to the end.
  if (!chain.outputs_valid()) return std::nullopt;
  for (int k = 0; k < nout; ++k)
    last_use[static_cast<size_t>(chain.output(static_cast<size_t>(k)))] = nops;
  // Slots by liveness; an input no op reads gets none (it is not loaded).
  std::vector<int> slot(static_cast<size_t>(ni + nops), kChainNoSlot);
  bool used[kChainSlots] = {};
  auto take = [&](int v) {
    for (int k = 0; k < kChainSlots; ++k) {
      if (!used[k]) {
        used[k] = true;
        slot[static_cast<size_t>(v)] = k;
        return true;
      }
    }
    return false;
  };
  for (int k = 0; k < ni; ++k) {
    c.in[k].dtype = static_cast<uint8_t>(chain.input_dtypes[static_cast<size_t>(k)]);
    if (last_use[static_cast<size_t>(k)] >= 0 && !take(k)) return std::nullopt;
    c.in[k].slot = static_cast<uint8_t>(slot[static_cast<size_t>(k)]);
  }
  for (int i = 0; i < nops; ++i) {
    const backend::ChainOp& o = chain.ops[static_cast<size_t>(i)];
    ChainStep& s = c.step[i];
    const int nsrc = o.reads();
    for (int j = 0; j < nsrc; ++j)
      s.src[j] = static_cast<uint8_t>(slot[static_cast<size_t>(o.src[j])]);
    for (int j = 0; j < nsrc; ++j) {
      if (last_use[static_cast<size_t>(o.src[j])] == i) used[s.src[j]] = false;
    }
    const int v = ni + i;
    if (!take(v)) return std::nullopt;
    s.dst = static_cast<uint8_t>(slot[static_cast<size_t>(v)]);
    if (last_use[static_cast<size_t>(v)] < 0) used[s.dst] = false;  // dead
  }
  for (int k = 0; k < nout; ++k) {
    const int v = chain.output(static_cast<size_t>(k));
    c.out[k].slot = static_cast<uint8_t>(slot[static_cast<size_t>(v)]);
    c.out[k].dtype = static_cast<uint8_t>(chain.value_dtype(v));
  }
  return c;
}

}  // namespace

void CudaBackend::binary_unary(int device, backend::BinaryOp bop, backend::UnaryOp uop, DType dtype,
                               const std::vector<int64_t>& shape, const backend::Strided& a,
                               const backend::Strided& b, void* y) {
  const std::optional<Walk> w = fusable(dtype) ? walk2(shape, {&a, &b}) : std::nullopt;
  if (!w || backend::is_comparison(bop)) {
    Backend::binary_unary(device, bop, uop, dtype, shape, a, b, y);
    return;
  }
  set(device);
  MESHRT_CUDA_CHECK(launch_binary_unary(ops_stream(device), backend::code(bop), backend::code(uop),
                                        dtype, w->rows, w->cols, w->ops[0], w->ops[1], y),
                    device);
}

void CudaBackend::compare_select(int device, backend::BinaryOp cmp, DType in, DType dtype,
                                 const std::vector<int64_t>& shape, const backend::Strided& x0,
                                 const backend::Strided& x1, const backend::Strided& a,
                                 const backend::Strided& b, void* y) {
  const std::optional<Walk> w =
      fusable(in) && fusable(dtype) ? walk2(shape, {&x0, &x1, &a, &b}) : std::nullopt;
  if (!w || !backend::is_comparison(cmp)) {
    Backend::compare_select(device, cmp, in, dtype, shape, x0, x1, a, b, y);
    return;
  }
  set(device);
  MESHRT_CUDA_CHECK(
      launch_compare_select(ops_stream(device), backend::code(cmp), in, dtype, w->rows, w->cols,
                            w->ops[0], w->ops[1], w->ops[2], w->ops[3], y),
      device);
}

bool CudaBackend::fuses_chain(const backend::ElementwiseChain& chain) const {
  return chains_ && plan_chain(chain).has_value();
}

void CudaBackend::elementwise_chain(int device, const backend::ElementwiseChain& chain,
                                    const std::vector<int64_t>& shape,
                                    std::span<const backend::Strided> inputs,
                                    std::span<void* const> ys) {
  std::optional<ChainLaunch> c =
      chains_ && inputs.size() == chain.input_dtypes.size() && ys.size() == chain.output_count()
          ? plan_chain(chain)
          : std::nullopt;
  // The dims merged over the inputs the chain reads (y is dense, so it merges with any of them).
  backend::MergedDims m;
  if (c) {
    std::vector<const std::vector<int64_t>*> strides;
    for (int k = 0; k < c->inputs; ++k) {
      if (c->in[k].slot != kChainNoSlot) strides.push_back(&inputs[static_cast<size_t>(k)].strides);
    }
    m = backend::merge_dims(shape, strides);
    if (m.size.size() > static_cast<size_t>(kMaxRank)) c.reset();
  }
  if (!c) {
    Backend::elementwise_chain(device, chain, shape, inputs, ys);
    return;
  }
  for (int k = 0; k < c->outputs; ++k) c->out[k].data = ys[static_cast<size_t>(k)];
  c->dims.rank = static_cast<int>(m.size.size());
  for (size_t d = 0; d < m.size.size(); ++d) c->dims.size[d] = m.size[d];
  for (int k = 0, used = 0; k < c->inputs; ++k) {
    ChainInput& in = c->in[k];
    in.data = inputs[static_cast<size_t>(k)].data;
    if (in.slot == kChainNoSlot) continue;
    const std::vector<int64_t>& st = m.strides[static_cast<size_t>(used++)];
    std::copy(st.begin(), st.end(), in.stride);
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  // float16 divided by a broadcast input (or a constant, one element filled for the unfused
  // kernel) divides through its reciprocal, as its own kernel.
  for (int i = 0; i < c->ops; ++i) {
    const backend::ChainOp& o = chain.ops[static_cast<size_t>(i)];
    if (o.kind != backend::ChainOp::Kind::binary || o.in != DType::f16 ||
        o.op != backend::code(backend::BinaryOp::div)) {
      continue;
    }
    const bool broadcast =
        o.src[1] < c->inputs ? divisor_broadcast(c->dims.rank, c->dims.size, c->in[o.src[1]].stride)
                             : chain.ops[static_cast<size_t>(o.src[1] - c->inputs)].kind ==
                                       backend::ChainOp::Kind::constant &&
                                   n > 1;
    if (broadcast) c->step[i].flags |= kChainRecipDiv;
  }
  set(device);
  MESHRT_CUDA_CHECK(launch_chain(ops_stream(device), *c, n), device);
}

}  // namespace meshrt::cuda
