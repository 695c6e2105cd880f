#include "backends/backend.h"

#include <atomic>
#include <string>

#include "backends/native_comm.h"
#include "core/error.h"
#include "core/strided.h"

namespace meshrt::backend {

Buffer::~Buffer() {
  backend_->deallocate(device_, data_, bytes_);
  note_buffer_bytes(-static_cast<int64_t>(bytes_));
}

namespace {
std::atomic<int64_t> g_in_use{0};
std::atomic<int64_t> g_peak{0};
}  // namespace

void note_buffer_bytes(int64_t delta) {
  const int64_t now = g_in_use.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
int64_t buffer_bytes_in_use() { return g_in_use.load(std::memory_order_relaxed); }
int64_t buffer_bytes_peak() { return g_peak.load(std::memory_order_relaxed); }
void reset_buffer_bytes_peak() { g_peak.store(buffer_bytes_in_use(), std::memory_order_relaxed); }

namespace {
[[noreturn]] void unsupported(const Backend& b, const char* what) {
  throw Error(std::string("[collectives] the ") + std::string(b.platform()) +
              " platform does not provide " + what + "; this is a meshrt bug, please report it");
}
}  // namespace

void Backend::copy_2d_batch(const std::vector<DeviceCopy>& copies) {
  for (const DeviceCopy& c : copies) {
    copy_2d(c.dst, c.dst_device, c.dpitch, c.src, c.src_device, c.spitch, c.width, c.height);
  }
}

void Backend::binary_unary(int device, BinaryOp bop, UnaryOp uop, DType dtype,
                           const std::vector<int64_t>& shape, const Strided& a, const Strided& b,
                           void* y) {
  std::shared_ptr<Buffer> t =
      allocate(device, static_cast<size_t>(shape_size(shape)) * dtype_size(dtype));
  binary(device, bop, dtype, dtype, shape, a, b, t->data());
  unary(device, uop, dtype, dtype, shape, Strided{t->data(), core::dense_strides(shape)}, y);
}

void Backend::compare_select(int device, BinaryOp cmp, DType in, DType dtype,
                             const std::vector<int64_t>& shape, const Strided& x0,
                             const Strided& x1, const Strided& a, const Strided& b, void* y) {
  std::shared_ptr<Buffer> t = allocate(device, static_cast<size_t>(shape_size(shape)));
  binary(device, cmp, in, DType::bool_, shape, x0, x1, t->data());
  select(device, dtype, shape, Strided{t->data(), core::dense_strides(shape)}, a, b, y);
}

void Backend::elementwise_chain(int device, const ElementwiseChain& chain,
                                const std::vector<int64_t>& shape, std::span<const Strided> inputs,
                                std::span<void* const> ys) {
  if (ys.size() != chain.output_count()) {
    throw Error("[backend] elementwise_chain: " + std::to_string(ys.size()) +
                " destinations for a chain of " + std::to_string(chain.output_count()) +
                " outputs");
  }
  if (!chain.outputs_valid()) {
    throw Error(
        "[backend] elementwise_chain: every output must be an op's result other than a "
        "constant's, the last the last op's");
  }
  const std::vector<int64_t> dense = core::dense_strides(shape);
  const std::vector<int64_t> broadcast(shape.size(), 0);
  const auto n = static_cast<size_t>(shape_size(shape));
  std::vector<std::shared_ptr<Buffer>> temps(chain.ops.size());
  auto value = [&](int v) {
    if (v < chain.inputs) return inputs[static_cast<size_t>(v)];
    const auto i = static_cast<size_t>(v - chain.inputs);
    return Strided{temps[i]->data(),
                   chain.ops[i].kind == ChainOp::Kind::constant ? broadcast : dense};
  };
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const ChainOp& o = chain.ops[i];
    if (o.kind == ChainOp::Kind::constant) {  // one element, read broadcast: fill's bits
      temps[i] = allocate(device, dtype_size(o.out));
      fill(device, o.out, 1, o.value, false, temps[i]->data());
      continue;
    }
    void* out = ys.back();
    if (i + 1 < chain.ops.size()) {
      temps[i] = allocate(device, n * dtype_size(o.out));
      out = temps[i]->data();
    }
    switch (o.kind) {
      case ChainOp::Kind::unary:
        unary(device, static_cast<UnaryOp>(o.op), o.in, o.out, shape, value(o.src[0]), out);
        break;
      case ChainOp::Kind::binary:
        binary(device, static_cast<BinaryOp>(o.op), o.in, o.out, shape, value(o.src[0]),
               value(o.src[1]), out);
        break;
      case ChainOp::Kind::select:
        select(device, o.out, shape, value(o.src[0]), value(o.src[1]), value(o.src[2]), out);
        break;
      case ChainOp::Kind::constant:
        break;
    }
  }
  // The earlier outputs once every op has read the inputs (an output may be an input's memory).
  for (size_t k = 0; k + 1 < ys.size(); ++k) {
    const int v = chain.output(k);
    const size_t bytes = n * dtype_size(chain.value_dtype(v));
    if (bytes > 0) {
      copy_2d(ys[k], device, bytes, temps[static_cast<size_t>(v - chain.inputs)]->data(), device,
              bytes, bytes, 1);
    }
  }
}

void Backend::matmul_bias(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                          bool trans_a, const void* b, bool trans_b, Precision precision,
                          const void* bias, bool relu, void* y) {
  product(device, dtype, 1, m, n, k, a, trans_a, b, trans_b, y, precision);  // the unfused bits
  const std::vector<int64_t> shape{m, n};
  const Strided out{y, {n, 1}}, row{bias, {0, 1}};
  if (relu) {
    binary_unary(device, BinaryOp::add, UnaryOp::relu, dtype, shape, out, row, y);
  } else {
    binary(device, BinaryOp::add, dtype, dtype, shape, out, row, y);
  }
}

void Backend::matmul_drelu(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                           bool trans_a, const void* b, bool trans_b, Precision precision,
                           const void* relu_out, void* y) {
  const std::shared_ptr<Buffer> zero = allocate(device, dtype_size(dtype));
  fill(device, dtype, 1, 0.0, false, zero->data());
  matmul_drelu_unfused(device, dtype, m, n, k, a, trans_a, b, trans_b, precision, relu_out,
                       zero->data(), y);
}

void Backend::matmul_drelu_unfused(int device, DType dtype, int64_t m, int64_t n, int64_t k,
                                   const void* a, bool trans_a, const void* b, bool trans_b,
                                   Precision precision, const void* relu_out, const void* zero,
                                   void* y) {
  product(device, dtype, 1, m, n, k, a, trans_a, b, trans_b, y, precision);  // the unfused bits
  // relu's gradient as autodiff writes it: where(relu_out > 0, g, 0), both zeros scalars.
  const std::vector<int64_t> shape{m, n};
  const Strided g{y, {n, 1}}, out{relu_out, {n, 1}}, z{zero, {0, 0}};
  compare_select(device, BinaryOp::gt, dtype, dtype, shape, out, z, g, z, y);
}

void Backend::product(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                      const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                      Precision precision) {
  if (precision != Precision::highest && dtype == DType::f32) {
    matmul_prec(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, c, precision);
  } else if (!trans_a && !trans_b) {
    matmul(device, dtype, batch, m, n, k, a, b, c);
  } else {
    matmul_t(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, c);
  }
}

void Backend::matmul_t(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                       const void* a, bool trans_a, const void* b, bool trans_b, void* c) {
  // A stored (rows, cols) matrix per batch entry, copied transposed into a new dense buffer.
  auto transposed = [&](const void* src, int64_t rows, int64_t cols) {
    std::shared_ptr<Buffer> t =
        allocate(device, static_cast<size_t>(batch * rows * cols) * dtype_size(dtype));
    unary(device, UnaryOp::copy, dtype, dtype, {batch, cols, rows},
          Strided{src, {rows * cols, 1, cols}}, t->data());
    return t;
  };
  std::shared_ptr<Buffer> ta = trans_a ? transposed(a, k, m) : nullptr;
  std::shared_ptr<Buffer> tb = trans_b ? transposed(b, n, k) : nullptr;
  matmul(device, dtype, batch, m, n, k, ta ? ta->data() : a, tb ? tb->data() : b, c);
}

void Backend::matmul_prec(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                          const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                          Precision) {
  matmul_t(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, c);
}

void Backend::synchronize(int) {
  if (!host_addressable()) unsupported(*this, "a way to wait for queued work (synchronize)");
}

void Backend::coll_begin(int) { unsupported(*this, "collective data movement"); }
void* Backend::coll_begin_token(int device) {
  coll_begin(device);
  return nullptr;
}
void Backend::coll_copy_2d(int, void*, size_t, const void*, size_t, size_t, size_t) {
  unsupported(*this, "collective data movement");
}
void Backend::coll_zero(int, void*, size_t) { unsupported(*this, "collective data movement"); }
void Backend::coll_fold(int, FoldOp, DType, DType, void*, const std::vector<const void*>&,
                        int64_t) {
  unsupported(*this, "collective reductions");
}
void Backend::coll_fold_rows(int device, FoldOp op, DType dtype, void* dst, int64_t dpitch,
                             const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                             int64_t rows) {
  const auto e = static_cast<int64_t>(dtype_size(dtype));
  std::vector<const void*> row(srcs.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < srcs.size(); ++j)
      row[j] = static_cast<const char*>(srcs[j]) + r * spitch * e;
    coll_fold(device, op, dtype, dtype, static_cast<char*>(dst) + r * dpitch * e, row, len);
  }
}
void Backend::coll_fold_to(int device, FoldOp op, DType in, DType out,
                           const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                           int64_t len) {
  if (dsts.empty() || len == 0) return;
  coll_fold(device, op, in, out, dsts[0], srcs, len);
  const size_t bytes = static_cast<size_t>(len) * dtype_size(out);
  for (size_t k = 1; k < dsts.size(); ++k) {
    if (dsts[k] != dsts[0]) coll_copy_2d(device, dsts[k], bytes, dsts[0], bytes, bytes, 1);
  }
}
void Backend::coll_mean(int, DType, DType, void*, const void*, int64_t, int64_t) {
  unsupported(*this, "collective reductions");
}
void Backend::coll_fence(int) { unsupported(*this, "collective data movement"); }
void* Backend::coll_signal(int) { unsupported(*this, "collective data movement"); }
void Backend::coll_wait_token(int, void*) { unsupported(*this, "collective data movement"); }
void Backend::coll_release_token(int, void*) noexcept {}
void Backend::coll_order_compute(int device, void* token) {
  coll_wait_token(device, token);
  coll_fence(device);
}

std::string Backend::native_unavailable(const std::vector<int>& group) {
  if (NativeComm* nc = native_comm()) return nc->unavailable(group);
  return std::string("the ") + std::string(platform()) +
         " platform has no native collective library";
}
std::string Backend::direct_unavailable(const std::vector<int>&) { return ""; }

}  // namespace meshrt::backend
