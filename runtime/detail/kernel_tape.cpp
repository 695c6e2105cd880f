// Recording a device-local function's kernel calls, checking the recording, and replaying it.
#include "runtime/detail/kernel_tape.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>

#include "core/config.h"
#include "core/strings.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/trace.h"

namespace meshrt::detail {

using backend::BinaryOp;
using backend::FoldOp;
using backend::ReduceOp;
using backend::Strided;
using backend::UnaryOp;

namespace {

// The recording stand-in: forwards every call to the real backend and writes the kernels down.
// Anything a straight-line program cannot repeat marks the recording refused (and still runs,
// so fn finishes normally).
class KernelRecorder final : public backend::Backend {
 public:
  KernelRecorder(backend::Backend& real, int device, const std::vector<Tensor>& operands)
      : Backend(real.host_addressable()), real_(real), device_(device) {
    for (const Tensor& t : operands) {
      ranges_.push_back({static_cast<const char*>(t.data()), t.nbytes()});
    }
    prog_.operands = static_cast<int>(operands.size());
  }
  backend::Backend& real() const { return real_; }
  const std::string& refused() const { return refused_; }
  KernelProgram& program() { return prog_; }
  // Where `p` is: an operand's block (its start first), then a buffer fn allocated.
  std::optional<KernelAddr> find(const void* p) const {
    const char* c = static_cast<const char*>(p);
    for (size_t i = 0; i < ranges_.size(); ++i) {
      if (c == ranges_[i].first) return KernelAddr{static_cast<int32_t>(i), 0};
    }
    for (size_t i = 0; i < ranges_.size(); ++i) {
      if (c > ranges_[i].first && c < ranges_[i].first + ranges_[i].second) {
        return KernelAddr{static_cast<int32_t>(i), c - ranges_[i].first};
      }
    }
    for (size_t i = 0; i < temps_.size(); ++i) {
      const char* lo = static_cast<const char*>(temps_[i]->data());
      if (c >= lo && c < lo + std::max<size_t>(temps_[i]->bytes(), 1)) {
        return KernelAddr{static_cast<int32_t>(ranges_.size() + i), c - lo};
      }
    }
    return std::nullopt;
  }

  std::string_view platform() const override { return real_.platform(); }
  int device_count() const override { return real_.device_count(); }
  std::string unavailable_reason() const override { return real_.unavailable_reason(); }

  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override {
    on_device(device, "an allocation");
    std::shared_ptr<backend::Buffer> b = real_.allocate(device, bytes);
    if (device == device_) {
      temps_.push_back(b);  // kept until the recording ends: no address is reused meanwhile
      prog_.temp_bytes.push_back(bytes);
    }
    return b;
  }
  void deallocate(int device, void* data, size_t bytes) noexcept override {
    real_.deallocate(device, data, bytes);
  }
  void copy_2d(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
               size_t spitch, size_t width, size_t height) override {
    if (dst_device != device_ || src_device != device_) {
      refuse("a copy between devices or with the host");
    }
    KernelCall c;
    c.kind = KernelCall::Kind::copy;
    c.nsrc = 1;
    c.arg[0] = static_cast<int64_t>(width);
    c.arg[1] = static_cast<int64_t>(height);
    c.arg[2] = static_cast<int64_t>(dpitch);
    c.arg[3] = static_cast<int64_t>(spitch);
    add(c, {src}, dst);
    real_.copy_2d(dst, dst_device, dpitch, src, src_device, spitch, width, height);
  }
  void unary(int device, UnaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
             const Strided& x, void* y) override {
    add_elementwise(device, KernelCall::Kind::unary, static_cast<int>(op), in, out, shape, {&x}, y);
    real_.unary(device, op, in, out, shape, x, y);
  }
  void binary(int device, BinaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
              const Strided& a, const Strided& b, void* y) override {
    add_elementwise(device, KernelCall::Kind::binary, static_cast<int>(op), in, out, shape,
                    {&a, &b}, y);
    real_.binary(device, op, in, out, shape, a, b, y);
  }
  void select(int device, DType dtype, const std::vector<int64_t>& shape, const Strided& cond,
              const Strided& a, const Strided& b, void* y) override {
    add_elementwise(device, KernelCall::Kind::select, 0, dtype, dtype, shape, {&cond, &a, &b}, y);
    real_.select(device, dtype, shape, cond, a, b, y);
  }
  void reduce(int device, ReduceOp op, DType dtype, int64_t outer, int64_t len, int64_t inner,
              const void* x, void* y) override {
    on_device(device, "a kernel");
    KernelCall c;
    c.kind = KernelCall::Kind::reduce;
    c.op = static_cast<int>(op);
    c.in = c.out = dtype;
    c.nsrc = 1;
    c.arg[0] = outer;
    c.arg[1] = len;
    c.arg[2] = inner;
    add(c, {x}, y);
    real_.reduce(device, op, dtype, outer, len, inner, x, y);
  }
  void matmul(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
              const void* a, const void* b, void* y) override {
    add_matmul(device, dtype, batch, m, n, k, a, false, b, false, y);
    real_.matmul(device, dtype, batch, m, n, k, a, b, y);
  }
  void matmul_t(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                const void* a, bool trans_a, const void* b, bool trans_b, void* y) override {
    add_matmul(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, y);
    real_.matmul_t(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, y);
  }
  void matmul_prec(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                   const void* a, bool trans_a, const void* b, bool trans_b, void* y,
                   Precision precision) override {
    add_matmul(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, y, precision);
    real_.matmul_prec(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, y, precision);
  }
  void fill(int device, DType dtype, int64_t n, double value, bool iota, void* y) override {
    on_device(device, "a kernel");
    KernelCall c;
    c.kind = KernelCall::Kind::fill;
    c.in = c.out = dtype;
    c.arg[0] = n;
    c.value = value;
    c.iota = iota;
    add(c, {}, y);
    real_.fill(device, dtype, n, value, iota, y);
  }
  // Waiting changes nothing a replay computes.
  void synchronize(int device) override { real_.synchronize(device); }
  void submit(int device, std::function<void()> task) override {
    refuse("a task on an executor");
    real_.submit(device, std::move(task));
  }

  // Collective primitives: never part of a device-local function.
  void coll_begin(int device) override {
    refuse("a collective");
    real_.coll_begin(device);
  }
  void coll_copy_2d(int device, void* dst, size_t dpitch, const void* src, size_t spitch,
                    size_t width, size_t height) override {
    refuse("a collective");
    real_.coll_copy_2d(device, dst, dpitch, src, spitch, width, height);
  }
  void coll_zero(int device, void* dst, size_t bytes) override {
    refuse("a collective");
    real_.coll_zero(device, dst, bytes);
  }
  void coll_fold(int device, FoldOp op, DType in, DType out, void* dst,
                 const std::vector<const void*>& srcs, int64_t len) override {
    refuse("a collective");
    real_.coll_fold(device, op, in, out, dst, srcs, len);
  }
  void coll_fold_rows(int device, FoldOp op, DType dtype, void* dst, int64_t dpitch,
                      const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                      int64_t rows) override {
    refuse("a collective");
    real_.coll_fold_rows(device, op, dtype, dst, dpitch, srcs, spitch, len, rows);
  }
  void coll_mean(int device, DType in, DType out, void* dst, const void* sum, int64_t len,
                 int64_t divisor) override {
    refuse("a collective");
    real_.coll_mean(device, in, out, dst, sum, len, divisor);
  }
  void coll_fence(int device) override {
    refuse("a collective");
    real_.coll_fence(device);
  }
  void* coll_signal(int device) override {
    refuse("a collective");
    return real_.coll_signal(device);
  }
  void coll_wait_token(int device, void* token) override {
    refuse("a collective");
    real_.coll_wait_token(device, token);
  }
  void coll_release_token(int device, void* token) noexcept override {
    real_.coll_release_token(device, token);
  }
  backend::NativeComm* native_comm() override {
    refuse("a collective");
    return real_.native_comm();
  }
  std::string direct_unavailable(const std::vector<int>& group) override {
    return real_.direct_unavailable(group);
  }

 private:
  void refuse(const std::string& why) {
    if (refused_.empty()) refused_ = why;
  }
  void on_device(int device, const char* what) {
    if (device != device_) refuse(cat(what, " on another device"));
  }
  KernelAddr addr(const void* p) {
    std::optional<KernelAddr> a = find(p);
    if (!a) {
      refuse("an address that is neither an operand's nor allocated by the function");
      return {};
    }
    return *a;
  }
  void set_dst(KernelCall& c, void* dst) {
    c.dst = addr(dst);
    if (refused_.empty() && c.dst.slot < prog_.operands) refuse("a kernel writing into an operand");
  }
  void add(KernelCall& c, std::initializer_list<const void*> srcs, void* dst) {
    int i = 0;
    for (const void* s : srcs) c.src[i++] = addr(s);
    set_dst(c, dst);
    prog_.calls.push_back(std::move(c));
  }
  void add_matmul(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                  const void* a, bool trans_a, const void* b, bool trans_b, void* y,
                  Precision precision = Precision::highest) {
    on_device(device, "a kernel");
    KernelCall c;
    c.kind = KernelCall::Kind::matmul;
    c.op = (trans_a ? 1 : 0) | (trans_b ? 2 : 0) | (precision == Precision::tf32 ? 4 : 0);
    c.in = c.out = dtype;
    c.nsrc = 2;
    c.arg[0] = batch;
    c.arg[1] = m;
    c.arg[2] = n;
    c.arg[3] = k;
    add(c, {a, b}, y);
  }
  // unary, binary, select: strided operands, a dense result.
  void add_elementwise(int device, KernelCall::Kind kind, int op, DType in, DType out,
                       const std::vector<int64_t>& shape,
                       std::initializer_list<const Strided*> srcs, void* dst) {
    on_device(device, "a kernel");
    KernelCall c;
    c.kind = kind;
    c.op = op;
    c.in = in;
    c.out = out;
    c.shape = shape;
    c.strided = static_cast<int>(prog_.strides.size());
    for (const Strided* s : srcs) {
      c.src[c.nsrc++] = addr(s->data);
      prog_.strides.push_back(s->strides);
    }
    set_dst(c, dst);
    prog_.calls.push_back(std::move(c));
  }

  backend::Backend& real_;
  const int device_;
  std::vector<std::pair<const char*, size_t>> ranges_;
  std::vector<std::shared_ptr<backend::Buffer>> temps_;
  KernelProgram prog_;
  std::string refused_;
};

thread_local KernelRecorder* t_recorder = nullptr;

// Installs a recorder on this thread (and no tracer: the recording is not part of any trace).
class RecorderScope {
 public:
  explicit RecorderScope(KernelRecorder* recorder) : previous_(t_recorder) {
    t_recorder = recorder;
  }
  RecorderScope(const RecorderScope&) = delete;
  RecorderScope& operator=(const RecorderScope&) = delete;
  ~RecorderScope() { t_recorder = previous_; }

 private:
  KernelRecorder* previous_;
  TraceScope untraced_{TraceScope::none};
};

KernelRecord refused(std::string why) { return KernelRecord{nullptr, std::move(why)}; }

// `bytes` of device memory at `dst` set to `pattern`: a memset where the host reaches device
// memory, else one copy from a host buffer (which orders itself after the device's queued work).
void fill_pattern(backend::Backend& be, int device, void* dst, size_t bytes,
                  unsigned char pattern) {
  if (bytes == 0) return;
  if (be.host_addressable()) {
    std::memset(dst, pattern, bytes);
    return;
  }
  const std::vector<unsigned char> host(bytes, pattern);
  be.copy_2d(dst, device, bytes, host.data(), backend::kHost, bytes, bytes, 1);
}

// `bytes` of device memory at `src`, read into host memory (a copy that waits for the device).
std::vector<char> read_back(backend::Backend& be, int device, const void* src, size_t bytes) {
  std::vector<char> out(bytes);
  if (bytes == 0) return out;
  if (be.host_addressable()) {
    std::memcpy(out.data(), src, bytes);
  } else {
    be.copy_2d(out.data(), backend::kHost, bytes, src, device, bytes, bytes, 1);
  }
  return out;
}

// Runs `p` on the recording's operands into temporaries filled with `pattern` and compares the
// results with fn's, byte for byte (read back through the backend on a device platform).
bool reproduces(const KernelProgram& p, backend::Backend& be, int device,
                const std::vector<Tensor>& operands, const std::vector<Tensor>& expected,
                unsigned char pattern) {
  std::vector<std::shared_ptr<backend::Buffer>> temps;
  std::vector<char*> base;
  for (const Tensor& t : operands) base.push_back(static_cast<char*>(t.data()));
  for (size_t bytes : p.temp_bytes) {
    temps.push_back(be.allocate(device, bytes));
    fill_pattern(be, device, temps.back()->data(), bytes, pattern);
    base.push_back(static_cast<char*>(temps.back()->data()));
  }
  std::vector<Strided> scratch = p.make_scratch();
  p.run(be, device, base.data(), scratch);
  for (size_t r = 0; r < expected.size(); ++r) {
    const char* got = base[static_cast<size_t>(p.results[r].slot)] + p.results[r].offset;
    const size_t n = expected[r].nbytes();
    if (read_back(be, device, got, n) != read_back(be, device, expected[r].data(), n)) return false;
  }
  return true;
}

}  // namespace

std::vector<Strided> KernelProgram::make_scratch() const {
  std::vector<Strided> s;
  s.reserve(strides.size());
  for (const std::vector<int64_t>& st : strides) s.push_back(Strided{nullptr, st});
  return s;
}

void KernelProgram::run(backend::Backend& be, int device, char* const* base,
                        std::vector<Strided>& scratch) const {
  auto at = [base](const KernelAddr& a) { return base[a.slot] + a.offset; };
  for (const KernelCall& c : calls) {
    switch (c.kind) {
      case KernelCall::Kind::unary: {
        Strided& x = scratch[static_cast<size_t>(c.strided)];
        x.data = at(c.src[0]);
        be.unary(device, static_cast<UnaryOp>(c.op), c.in, c.out, c.shape, x, at(c.dst));
        break;
      }
      case KernelCall::Kind::binary: {
        Strided& a = scratch[static_cast<size_t>(c.strided)];
        Strided& b = scratch[static_cast<size_t>(c.strided) + 1];
        a.data = at(c.src[0]);
        b.data = at(c.src[1]);
        be.binary(device, static_cast<BinaryOp>(c.op), c.in, c.out, c.shape, a, b, at(c.dst));
        break;
      }
      case KernelCall::Kind::select: {
        Strided& k = scratch[static_cast<size_t>(c.strided)];
        Strided& a = scratch[static_cast<size_t>(c.strided) + 1];
        Strided& b = scratch[static_cast<size_t>(c.strided) + 2];
        k.data = at(c.src[0]);
        a.data = at(c.src[1]);
        b.data = at(c.src[2]);
        be.select(device, c.in, c.shape, k, a, b, at(c.dst));
        break;
      }
      case KernelCall::Kind::reduce:
        be.reduce(device, static_cast<ReduceOp>(c.op), c.in, c.arg[0], c.arg[1], c.arg[2],
                  at(c.src[0]), at(c.dst));
        break;
      case KernelCall::Kind::matmul:
        be.product(device, c.in, c.arg[0], c.arg[1], c.arg[2], c.arg[3], at(c.src[0]),
                   (c.op & 1) != 0, at(c.src[1]), (c.op & 2) != 0, at(c.dst),
                   (c.op & 4) != 0 ? Precision::tf32 : Precision::highest);
        break;
      case KernelCall::Kind::fill:
        be.fill(device, c.in, c.arg[0], c.value, c.iota, at(c.dst));
        break;
      case KernelCall::Kind::matmul_bias:
        be.matmul_bias(device, c.in, c.arg[1], c.arg[2], c.arg[3], at(c.src[0]), (c.op & 1) != 0,
                       at(c.src[1]), (c.op & 2) != 0,
                       (c.op & 4) != 0 ? Precision::tf32 : Precision::highest, at(c.src[2]),
                       c.op2 != 0, at(c.dst));
        break;
      case KernelCall::Kind::matmul_drelu:
        be.matmul_drelu(device, c.in, c.arg[1], c.arg[2], c.arg[3], at(c.src[0]), (c.op & 1) != 0,
                        at(c.src[1]), (c.op & 2) != 0,
                        (c.op & 4) != 0 ? Precision::tf32 : Precision::highest, at(c.src[2]),
                        at(c.dst));
        break;
      case KernelCall::Kind::binary_unary: {
        Strided& a = scratch[static_cast<size_t>(c.strided)];
        Strided& b = scratch[static_cast<size_t>(c.strided) + 1];
        a.data = at(c.src[0]);
        b.data = at(c.src[1]);
        be.binary_unary(device, static_cast<BinaryOp>(c.op), static_cast<UnaryOp>(c.op2), c.in,
                        c.shape, a, b, at(c.dst));
        break;
      }
      case KernelCall::Kind::compare_select: {
        Strided* x = &scratch[static_cast<size_t>(c.strided)];
        for (int j = 0; j < 4; ++j) x[j].data = at(c.src[j]);
        be.compare_select(device, static_cast<BinaryOp>(c.op), c.in, c.out, c.shape, x[0], x[1],
                          x[2], x[3], at(c.dst));
        break;
      }
      case KernelCall::Kind::chain: {
        Strided* x = &scratch[static_cast<size_t>(c.strided)];
        for (int j = 0; j < c.nsrc; ++j) x[j].data = at(c.src[j]);
        std::array<void*, backend::ElementwiseChain::kMaxOutputs> ys{};
        size_t ny = 0;
        for (const KernelAddr& m : c.more) ys[ny++] = at(m);
        ys[ny++] = at(c.dst);
        be.elementwise_chain(device, *c.chain, c.shape,
                             std::span<const Strided>(x, static_cast<size_t>(c.nsrc)),
                             std::span<void* const>(ys.data(), ny));
        break;
      }
      case KernelCall::Kind::copy:
        be.copy_2d(at(c.dst), device, static_cast<size_t>(c.arg[2]), at(c.src[0]), device,
                   static_cast<size_t>(c.arg[3]), static_cast<size_t>(c.arg[0]),
                   static_cast<size_t>(c.arg[1]));
        break;
    }
  }
}

uint64_t ProgramId::next() noexcept {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

bool KernelProgram::run_as_graph(backend::Backend& be, int device, char* const* base,
                                 std::vector<Strided>& scratch) const {
  const size_t slots = static_cast<size_t>(operands) + temp_bytes.size();
  auto body = [&] { run(be, device, base, scratch); };
  return be.run_graph(device, id.value(), reinterpret_cast<const void* const*>(base), slots,
                      backend::BodyRef(body));
}

namespace {

// The dtype an elementwise call reads its source j as: a chain's inputs have their own; select's
// condition (source 0) is bool; every other source is the call's input dtype.
DType source_dtype(const KernelCall& c, int j) {
  if (c.kind == KernelCall::Kind::chain) return c.chain->input_dtypes[static_cast<size_t>(j)];
  return c.kind == KernelCall::Kind::select && j == 0 ? DType::bool_ : c.in;
}

// Where a call writes: a chain's outputs in order (`more`, then dst), else its destination.
std::vector<KernelAddr> outputs_of(const KernelCall& c) {
  std::vector<KernelAddr> r = c.more;
  r.push_back(c.dst);
  return r;
}

}  // namespace

bool KernelProgram::may_write_over(int operand, size_t temp) const {
  const int32_t t = operands + static_cast<int32_t>(temp);
  size_t first = calls.size();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].writes(t)) {
      first = i;
      break;
    }
  }
  if (first == calls.size()) return false;
  for (size_t i = first + 1; i < calls.size(); ++i) {
    if (calls[i].reads(operand)) return false;
  }
  const KernelCall& c = calls[first];
  // Where c writes the temporary, and as what: one of a chain's outputs, or its destination.
  const std::vector<KernelAddr> outs = outputs_of(c);
  KernelAddr w = c.dst;
  DType wt = c.out;
  int found = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (outs[k].slot != t) continue;
    ++found;
    w = outs[k];
    if (c.kind == KernelCall::Kind::chain) wt = c.chain->value_dtype(c.chain->output(k));
  }
  if (found != 1) return false;  // two outputs in one temporary: not in place
  for (int j = 0; j < c.nsrc; ++j) {
    if (c.src[j].slot != operand) continue;
    // (compare_select reads sources of two dtypes: not taken in place.)
    const bool elementwise =
        c.kind == KernelCall::Kind::unary || c.kind == KernelCall::Kind::binary ||
        c.kind == KernelCall::Kind::select || c.kind == KernelCall::Kind::binary_unary ||
        c.kind == KernelCall::Kind::chain;
    if (!elementwise || c.src[j].offset != w.offset) return false;
    if (dtype_size(source_dtype(c, j)) != dtype_size(wt)) return false;
    const std::vector<int64_t>& st = strides[static_cast<size_t>(c.strided + j)];
    int64_t expect = 1;
    for (size_t d = c.shape.size(); d-- > 0;) {
      if (c.shape[d] == 1) continue;
      if (st[d] != expect) return false;
      expect *= c.shape[d];
    }
  }
  return true;
}

namespace {

// Whether `st` walks `shape` densely (row-major; dimensions of size 1 take any stride).
bool dense_over(const std::vector<int64_t>& shape, const std::vector<int64_t>& st) {
  int64_t expect = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    if (st[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

bool fusable_float(DType t) { return t == DType::f32 || t == DType::f64; }

// The fused call for producer `a` and consumer `b` (b reads a's result densely), or nothing.
std::optional<KernelCall> fuse_pair(KernelProgram& p, const KernelCall& a, const KernelCall& b) {
  using K = KernelCall::Kind;
  if (a.kind != K::binary || a.shape != b.shape) return std::nullopt;
  const auto bop = static_cast<BinaryOp>(a.op);
  if (b.kind == K::unary && !backend::is_comparison(bop) && a.in == a.out && fusable_float(a.in) &&
      b.in == a.out && b.out == a.out &&
      (b.op == static_cast<int>(UnaryOp::relu) || b.op == static_cast<int>(UnaryOp::neg)) &&
      dense_over(b.shape, p.strides[static_cast<size_t>(b.strided)])) {
    // relu and neg do no arithmetic the compiler could contract with bop's: the pair's bits.
    KernelCall f = a;
    f.kind = K::binary_unary;
    f.op2 = b.op;
    f.dst = b.dst;
    return f;
  }
  if (b.kind == K::select && backend::is_comparison(bop) && a.out == DType::bool_ &&
      fusable_float(a.in) && fusable_float(b.in) &&
      dense_over(b.shape, p.strides[static_cast<size_t>(b.strided)])) {
    KernelCall f = a;
    f.kind = K::compare_select;
    f.out = b.in;
    f.nsrc = 4;
    f.src[2] = b.src[1];
    f.src[3] = b.src[2];
    f.dst = b.dst;
    f.strided = static_cast<int>(p.strides.size());
    const std::vector<int64_t> s0 = p.strides[static_cast<size_t>(a.strided)],
                               s1 = p.strides[static_cast<size_t>(a.strided) + 1],
                               s2 = p.strides[static_cast<size_t>(b.strided) + 1],
                               s3 = p.strides[static_cast<size_t>(b.strided) + 2];
    for (const auto* st : {&s0, &s1, &s2, &s3}) p.strides.push_back(*st);
    return f;
  }
  return std::nullopt;
}

// Whether call `i` may move to call `to`'s place (a fused call computes there): no call between
// writes what call i reads or writes.
bool movable_to(const KernelProgram& p, size_t i, size_t to) {
  const KernelCall& a = p.calls[i];
  const std::vector<KernelAddr> outs = outputs_of(a);
  for (size_t j = i + 1; j < to; ++j) {
    const KernelCall& c = p.calls[j];
    for (const KernelAddr& o : outs) {
      if (c.writes(o.slot)) return false;
    }
    for (int k = 0; k < a.nsrc; ++k) {
      if (c.writes(a.src[k].slot)) return false;
    }
  }
  return true;
}

// The one call after call `i` that reads what call i writes (as one or more of its sources), when
// that is a temporary, not a result, read by nothing else, and nothing between the two writes it or
// what call i reads (a fused call moves call i's reads to the reader's place); else calls.size().
size_t sole_reader(const KernelProgram& p, size_t i) {
  const std::vector<KernelCall>& calls = p.calls;
  const KernelCall& a = calls[i];
  const int32_t t = a.dst.slot;
  if (t < p.operands) return calls.size();  // the intermediate must be a temporary
  for (const KernelAddr& r : p.results) {
    if (r.slot == t) return calls.size();
  }
  size_t reader = calls.size();
  int readers = 0;  // calls reading it (a call may read it as several of its sources)
  for (size_t j = i + 1; j < calls.size(); ++j) {
    if (!calls[j].reads(t)) continue;
    ++readers;
    if (reader == calls.size()) reader = j;
  }
  return readers == 1 && movable_to(p, i, reader) ? reader : calls.size();
}

// The first call after call `i` that reads what call i writes, when call i may move to its place:
// nothing between writes what call i reads or writes (nothing between reads what it writes: the
// reader is the first). Else calls.size().
size_t first_reader(const KernelProgram& p, size_t i) {
  const std::vector<KernelCall>& calls = p.calls;
  const KernelCall& a = calls[i];
  const std::vector<KernelAddr> outs = outputs_of(a);
  size_t reader = calls.size();
  for (size_t j = i + 1; j < calls.size() && reader == calls.size(); ++j) {
    for (const KernelAddr& o : outs) {
      if (calls[j].reads(o.slot)) reader = j;
    }
  }
  return reader < calls.size() && movable_to(p, i, reader) ? reader : calls.size();
}

// Whether slot `t`, written by call `i`, is needed after the call `reader` reads it: a result, an
// operand, or read by another call.
bool needed_elsewhere(const KernelProgram& p, int32_t t, size_t i, size_t reader) {
  if (t < p.operands) return true;
  for (const KernelAddr& r : p.results) {
    if (r.slot == t) return true;
  }
  for (size_t j = i + 1; j < p.calls.size(); ++j) {
    if (j != reader && p.calls[j].reads(t)) return true;
  }
  return false;
}

// Whether `st` reads one row of shape's last dimension again for every row (a (n,) bias
// broadcast over (m, n); dimensions of size 1 take any stride).
bool row_over(const std::vector<int64_t>& shape, const std::vector<int64_t>& st) {
  return shape.size() == 2 && (shape[0] == 1 || st[0] == 0) && (shape[1] == 1 || st[1] == 1);
}

// The epilogue call `b` (the sole reader of product `a`'s temporary) fused into `a`, if it is one
// (see fuse_matmul_epilogues).
std::optional<KernelCall> fuse_epilogue(const KernelProgram& p, const KernelCall& a,
                                        const KernelCall& b) {
  using K = KernelCall::Kind;
  const bool product = (a.kind == K::matmul || (a.kind == K::matmul_bias && a.op2 == 0)) &&
                       a.in == DType::f32 && a.out == DType::f32 && a.arg[0] == 1;
  if (!product) return std::nullopt;
  const std::vector<int64_t> shape{a.arg[1], a.arg[2]};
  if (b.shape != shape || b.in != DType::f32 || b.out != DType::f32) return std::nullopt;
  auto strides = [&](int j) -> const std::vector<int64_t>& {
    return p.strides[static_cast<size_t>(b.strided + j)];
  };
  auto reads_product = [&](int j) {
    return b.src[j].slot == a.dst.slot && b.src[j].offset == a.dst.offset &&
           dense_over(shape, strides(j));
  };
  // The fused call writes b's result (dense: results are) while reading a's operands and the
  // bias.
  for (int j = 0; j < a.nsrc; ++j) {
    if (b.dst.slot == a.src[j].slot) return std::nullopt;
  }
  KernelCall f = a;
  f.kind = K::matmul_bias;
  f.shape = shape;
  f.dst = b.dst;
  f.strided = -1;
  if (a.kind == K::matmul_bias) {  // a fused product, then relu
    if (b.kind != K::unary || b.op != static_cast<int>(UnaryOp::relu) || !reads_product(0)) {
      return std::nullopt;
    }
    f.op2 = 1;
    return f;
  }
  const bool add = (b.kind == K::binary ||
                    (b.kind == K::binary_unary && b.op2 == static_cast<int>(UnaryOp::relu))) &&
                   b.op == static_cast<int>(BinaryOp::add);
  if (!add) return std::nullopt;
  int bias = -1;
  if (reads_product(0) && row_over(shape, strides(1))) bias = 1;
  if (bias < 0 && reads_product(1) && row_over(shape, strides(0))) bias = 0;
  // The bias is another buffer than the product (z + z of a one-row product reads z as a "row"
  // too, and the fused call no longer writes z), and not the destination.
  if (bias < 0 || b.dst.slot == b.src[bias].slot || b.src[bias].slot == a.dst.slot) {
    return std::nullopt;
  }
  f.nsrc = 3;
  f.src[2] = b.src[bias];
  f.op2 = b.kind == K::binary_unary ? 1 : 0;
  return f;
}

bool chainable(KernelCall::Kind k) {
  using K = KernelCall::Kind;
  return k == K::unary || k == K::binary || k == K::select || k == K::chain;
}

// A chainable call as a chain: its ops, and its inputs' addresses and strides.
struct ChainParts {
  backend::ElementwiseChain chain;
  std::vector<KernelAddr> in;
  std::vector<std::vector<int64_t>> strides;
};

ChainParts as_chain(const KernelProgram& p, const KernelCall& c) {
  using K = KernelCall::Kind;
  ChainParts r;
  if (c.kind == K::chain) {
    r.chain = *c.chain;
  } else {
    backend::ChainOp o;
    o.kind = c.kind == K::unary    ? backend::ChainOp::Kind::unary
             : c.kind == K::binary ? backend::ChainOp::Kind::binary
                                   : backend::ChainOp::Kind::select;
    o.op = c.op;
    o.in = c.in;
    o.out = c.out;
    r.chain.inputs = c.nsrc;
    for (int j = 0; j < c.nsrc; ++j) {
      o.src[j] = j;
      r.chain.input_dtypes.push_back(source_dtype(c, j));
    }
    r.chain.ops.push_back(o);
  }
  for (int j = 0; j < c.nsrc; ++j) {
    r.in.push_back(c.src[j]);
    r.strides.push_back(p.strides[static_cast<size_t>(c.strided + j)]);
  }
  return r;
}

// The value of the one-element fill that `at` reads broadcast as dtype `t` over `shape`, where
// that fill is the only call writing it: a scalar the chain can hold as a constant op.
std::optional<double> scalar_fill(const KernelProgram& p, const KernelAddr& at,
                                  const std::vector<int64_t>& st, const std::vector<int64_t>& shape,
                                  DType t) {
  if (at.slot < p.operands || at.offset != 0) return std::nullopt;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] > 1 && st[d] != 0) return std::nullopt;
  }
  const KernelCall* w = nullptr;
  for (const KernelCall& c : p.calls) {
    if (!c.writes(at.slot)) continue;
    if (w != nullptr) return std::nullopt;
    w = &c;
  }
  if (w == nullptr || w->kind != KernelCall::Kind::fill || w->arg[0] != 1 || w->iota ||
      w->in != t || w->dst.offset != 0) {
    return std::nullopt;
  }
  return w->value;
}

// Call `a` and its first reader `b` (first_reader) as one chain call at b's place (see
// fuse_elementwise_chains), or nothing. a's outputs with `kept` set stay outputs (before b's); the
// rest become intermediates. Inputs reading the same address the same way are read once.
std::optional<KernelCall> fuse_chain(KernelProgram& p, const backend::Backend& be,
                                     const KernelCall& a, const KernelCall& b,
                                     const std::vector<bool>& kept) {
  if (!chainable(a.kind) || !chainable(b.kind) || a.shape != b.shape) return std::nullopt;
  const ChainParts pa = as_chain(p, a), pb = as_chain(p, b);
  const std::vector<KernelAddr> outs_a = outputs_of(a), outs_b = outputs_of(b);
  ChainParts f;
  f.chain.inputs = 0;
  // Scalars the program fills become constant ops (numbered kConst + k until the inputs are
  // counted), equal ones taken once.
  constexpr int kConst = 1 << 20;
  std::vector<backend::ChainOp> consts;
  auto input = [&](const KernelAddr& at, const std::vector<int64_t>& st, DType t) {
    if (const std::optional<double> v = scalar_fill(p, at, st, b.shape, t)) {
      for (size_t k = 0; k < consts.size(); ++k) {
        if (consts[k].out == t && std::memcmp(&consts[k].value, &*v, sizeof(double)) == 0) {
          return kConst + static_cast<int>(k);
        }
      }
      backend::ChainOp o;
      o.kind = backend::ChainOp::Kind::constant;
      o.in = o.out = t;
      o.value = *v;
      consts.push_back(o);
      return kConst + static_cast<int>(consts.size()) - 1;
    }
    for (size_t k = 0; k < f.in.size(); ++k) {
      if (f.in[k].slot == at.slot && f.in[k].offset == at.offset && f.strides[k] == st &&
          f.chain.input_dtypes[k] == t) {
        return static_cast<int>(k);
      }
    }
    f.in.push_back(at);
    f.strides.push_back(st);
    f.chain.input_dtypes.push_back(t);
    return f.chain.inputs++;
  };
  std::vector<int> from_a(pa.in.size());
  for (size_t k = 0; k < pa.in.size(); ++k) {
    from_a[k] = input(pa.in[k], pa.strides[k], pa.chain.input_dtypes[k]);
  }
  // b's inputs: a fused input, or (-1 - k) a's output k, read element for element where a wrote
  // it (an output is dense).
  std::vector<int> from_b(pb.in.size());
  bool linked = false;
  for (size_t k = 0; k < pb.in.size(); ++k) {
    const KernelAddr& at = pb.in[k];
    int link = -1;
    bool in_output = false;
    for (size_t o = 0; o < outs_a.size(); ++o) {
      if (outs_a[o].slot != at.slot) continue;
      in_output = true;
      if (outs_a[o].offset == at.offset && dense_over(b.shape, pb.strides[k]) &&
          pb.chain.input_dtypes[k] == pa.chain.value_dtype(pa.chain.output(o))) {
        link = static_cast<int>(o);
      }
    }
    if (in_output && link < 0) return std::nullopt;  // another part or view of what a writes
    if (link >= 0) {
      from_b[k] = -1 - link;
      linked = true;
    } else {
      from_b[k] = input(at, pb.strides[k], pb.chain.input_dtypes[k]);
    }
  }
  if (!linked || f.chain.inputs > KernelCall::kMaxSources ||
      consts.size() + pa.chain.ops.size() + pb.chain.ops.size() > kMaxChainOps) {
    return std::nullopt;
  }
  // Values: the inputs, then the ops in order, a's then b's, each constant just before its first
  // reader (so it holds a register of cuda's kernel only while it is needed).
  const int n = f.chain.inputs;
  std::vector<int> const_at(consts.size(), -1), a_at(pa.chain.ops.size()),
      b_at(pb.chain.ops.size());
  auto resolved = [&](int k) {
    if (k < kConst) return k;
    int& at = const_at[static_cast<size_t>(k - kConst)];
    if (at < 0) {
      at = n + static_cast<int>(f.chain.ops.size());
      f.chain.ops.push_back(consts[static_cast<size_t>(k - kConst)]);
    }
    return at;
  };
  auto a_value = [&](int v) {
    return v < pa.chain.inputs ? resolved(from_a[static_cast<size_t>(v)])
                               : a_at[static_cast<size_t>(v - pa.chain.inputs)];
  };
  auto b_value = [&](int v) {
    if (v >= pb.chain.inputs) return b_at[static_cast<size_t>(v - pb.chain.inputs)];
    const int k = from_b[static_cast<size_t>(v)];
    return k >= 0 ? resolved(k) : a_value(pa.chain.output(static_cast<size_t>(-1 - k)));
  };
  for (size_t i = 0; i < pa.chain.ops.size(); ++i) {
    backend::ChainOp o = pa.chain.ops[i];
    for (int j = 0; j < o.reads(); ++j) o.src[j] = a_value(o.src[j]);
    a_at[i] = n + static_cast<int>(f.chain.ops.size());
    f.chain.ops.push_back(o);
  }
  for (size_t i = 0; i < pb.chain.ops.size(); ++i) {
    backend::ChainOp o = pb.chain.ops[i];
    for (int j = 0; j < o.reads(); ++j) o.src[j] = b_value(o.src[j]);
    b_at[i] = n + static_cast<int>(f.chain.ops.size());
    f.chain.ops.push_back(o);
  }
  // Outputs: a's kept ones, then b's (its last the chain's last op).
  KernelCall c;
  for (size_t o = 0; o < outs_a.size(); ++o) {
    if (!kept[o]) continue;
    f.chain.outputs.push_back(a_value(pa.chain.output(o)));
    c.more.push_back(outs_a[o]);
  }
  for (size_t o = 0; o < outs_b.size(); ++o) {
    f.chain.outputs.push_back(b_value(pb.chain.output(o)));
    if (o + 1 < outs_b.size()) c.more.push_back(outs_b[o]);
  }
  if (f.chain.outputs.size() > backend::ElementwiseChain::kMaxOutputs) return std::nullopt;
  // No two outputs in one temporary (a kept value of a's that b then rewrites: the outputs are
  // written together, in no order the unfused calls had).
  for (size_t i = 0; i < c.more.size(); ++i) {
    if (c.more[i].slot == b.dst.slot) return std::nullopt;
    for (size_t j = 0; j < i; ++j) {
      if (c.more[j].slot == c.more[i].slot) return std::nullopt;
    }
  }
  if (f.chain.outputs.size() == 1) f.chain.outputs.clear();  // the last op's alone
  // The fused call writes its outputs while reading every input: not into one of them (as the
  // unfused b may, where it reads its own destination element for element: then keep b apart).
  for (const KernelAddr& at : f.in) {
    if (b.writes(at.slot)) return std::nullopt;
    for (const KernelAddr& m : c.more) {
      if (m.slot == at.slot) return std::nullopt;
    }
  }
  if (!be.fuses_chain(f.chain)) return std::nullopt;
  c.kind = KernelCall::Kind::chain;
  c.in = c.out = f.chain.ops.back().out;
  c.shape = b.shape;
  c.nsrc = n;
  c.strided = static_cast<int>(p.strides.size());
  for (int k = 0; k < n; ++k) {
    c.src[k] = f.in[static_cast<size_t>(k)];
    p.strides.push_back(f.strides[static_cast<size_t>(k)]);
  }
  c.dst = b.dst;
  c.chain = std::make_shared<const backend::ElementwiseChain>(std::move(f.chain));
  return c;
}

}  // namespace

namespace {

// Fuses each call of a kind `first` accepts into a later call reading what it writes: find(p, i)
// names that reader of call i (sole_reader, first_reader) or gives calls.size(), and fuse(p, i,
// reader) the fused call, which takes the reader's place (its other sources are ready there) while
// call i is dropped. A fused call is offered again as the loop reaches it. Returns the number of
// calls fused away.
template <class Find, class Fuse>
int fuse_into_readers(KernelProgram& p, bool (*first)(KernelCall::Kind), Find find, Fuse fuse) {
  std::vector<KernelCall>& calls = p.calls;
  std::vector<bool> gone(calls.size(), false);
  int fused = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (gone[i] || !first(calls[i].kind)) continue;
    const size_t reader = find(p, i);
    if (reader == calls.size()) continue;
    std::optional<KernelCall> f = fuse(p, i, reader);
    if (!f) continue;
    calls[reader] = std::move(*f);
    gone[i] = true;
    ++fused;
  }
  std::vector<KernelCall> kept;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!gone[i]) kept.push_back(std::move(calls[i]));
  }
  calls = std::move(kept);
  return fused;
}

// Drops the calls nothing needs any more: one-element fills (the scalars chains took as
// constants) and comparisons (relu's gradient fused into its product: fuse_drelu), whose result is
// no result of the program, no operand, and read by no call kept. Returns the comparisons dropped.
int drop_dead_calls(KernelProgram& p) {
  using K = KernelCall::Kind;
  std::vector<bool> dead(p.calls.size(), false);
  int compares = 0;
  for (size_t i = p.calls.size(); i-- > 0;) {  // last first: a dropped reader frees its sources
    const KernelCall& c = p.calls[i];
    const bool fill = c.kind == K::fill && c.arg[0] == 1;
    const bool compare = c.kind == K::binary && c.out == DType::bool_;
    if (!fill && !compare) continue;
    const int32_t t = c.dst.slot;
    bool needed = t < p.operands;
    for (const KernelAddr& r : p.results) needed = needed || r.slot == t;
    for (size_t j = i + 1; j < p.calls.size() && !needed; ++j) {
      needed = !dead[j] && p.calls[j].reads(t);
    }
    if (needed) continue;
    dead[i] = true;
    compares += compare ? 1 : 0;
  }
  std::vector<KernelCall> kept;
  for (size_t i = 0; i < p.calls.size(); ++i) {
    if (!dead[i]) kept.push_back(std::move(p.calls[i]));
  }
  p.calls = std::move(kept);
  return compares;
}

// Whether `at`, read through strides `st` over `shape`, is a float32 scalar +0.0 (a one-element
// fill only that fill writes, broadcast): the zeros of relu's gradient.
bool plus_zero(const KernelProgram& p, const KernelAddr& at, const std::vector<int64_t>& st,
               const std::vector<int64_t>& shape) {
  std::optional<double> v = scalar_fill(p, at, st, shape, DType::f32);
  if (!v && at.slot < p.operands && at.offset == 0 &&
      static_cast<size_t>(at.slot) < p.operand_scalars.size()) {
    // An operand jit knows (a one-element constant of the program), read broadcast.
    bool broadcast = true;
    for (size_t d = 0; d < shape.size(); ++d)
      broadcast = broadcast && (shape[d] == 1 || st[d] == 0);
    if (broadcast) v = p.operand_scalars[static_cast<size_t>(at.slot)];
  }
  return v && *v == 0.0 && !std::signbit(*v);
}

// Product `a` (call i) and relu's gradient after it, its sole reader `b` (call r): select(cond,
// a's result, +0) whose cond is `y > +0` from a comparison only b reads, or that pair already
// one compare_select. The fused matmul_drelu call (see fuse_relu_gradients), or nothing.
std::optional<KernelCall> fuse_drelu(const KernelProgram& p, size_t i, size_t r) {
  using K = KernelCall::Kind;
  const KernelCall& a = p.calls[i];
  const KernelCall& b = p.calls[r];
  if (a.kind != K::matmul || a.in != DType::f32 || a.out != DType::f32 || a.arg[0] != 1) {
    return std::nullopt;
  }
  const std::vector<int64_t> shape{a.arg[1], a.arg[2]};
  if (b.shape != shape) return std::nullopt;
  auto strides_of = [&](const KernelCall& c, int j) -> const std::vector<int64_t>& {
    return p.strides[static_cast<size_t>(c.strided + j)];
  };
  auto is_product = [&](const KernelCall& c, int j) {
    return c.src[j].slot == a.dst.slot && c.src[j].offset == a.dst.offset &&
           dense_over(shape, strides_of(c, j));
  };
  // The comparison: `y > +0` over float32, y dense and not the product. Returns y's address.
  auto relu_test = [&](const KernelCall& c, int x0, int x1) -> std::optional<KernelAddr> {
    if (c.op != static_cast<int>(BinaryOp::gt) || c.in != DType::f32) return std::nullopt;
    if (!dense_over(shape, strides_of(c, x0)) || !plus_zero(p, c.src[x1], strides_of(c, x1), shape))
      return std::nullopt;
    if (c.src[x0].slot == a.dst.slot) return std::nullopt;
    return c.src[x0];
  };
  std::optional<KernelAddr> y;
  size_t test = r;  // where y is read in the unfused program
  if (b.kind == K::compare_select) {
    if (b.out != DType::f32 || !is_product(b, 2) ||
        !plus_zero(p, b.src[3], strides_of(b, 3), shape))
      return std::nullopt;
    y = relu_test(b, 0, 1);
  } else if (b.kind == K::select) {
    if (b.in != DType::f32 || !is_product(b, 1) || !plus_zero(p, b.src[2], strides_of(b, 2), shape))
      return std::nullopt;
    // The comparison writing the condition: the last call before b writing it, b its only reader.
    const int32_t cond = b.src[0].slot;
    for (size_t j = r; j-- > 0;) {
      if (!p.calls[j].writes(cond)) continue;
      const KernelCall& c = p.calls[j];
      if (c.kind == K::binary && c.out == DType::bool_ && c.shape == shape &&
          c.dst.offset == b.src[0].offset && c.more.empty() &&
          dense_over(shape, strides_of(b, 0)) && !needed_elsewhere(p, cond, j, r)) {
        y = relu_test(c, 0, 1);
        test = j;
      }
      break;
    }
  }
  if (!y) return std::nullopt;
  // y holds at b's place what the comparison read, and the fused call does not write over it or
  // over a's operands while it reads them.
  for (size_t j = test + 1; j < r; ++j) {
    if (p.calls[j].writes(y->slot)) return std::nullopt;
  }
  if (b.dst.slot == y->slot || b.dst.slot == a.src[0].slot || b.dst.slot == a.src[1].slot) {
    return std::nullopt;
  }
  KernelCall f = a;
  f.kind = K::matmul_drelu;
  f.shape = shape;
  f.dst = b.dst;
  f.strided = -1;
  f.nsrc = 3;
  f.src[2] = *y;
  return f;
}

}  // namespace

int fuse_elementwise_pairs(KernelProgram& p) {
  auto binary = [](KernelCall::Kind k) { return k == KernelCall::Kind::binary; };
  return fuse_into_readers(p, binary, sole_reader,
                           [](KernelProgram& q, size_t i, size_t r) -> std::optional<KernelCall> {
                             const KernelCall a = q.calls[i], b = q.calls[r];
                             if (b.src[0].slot != a.dst.slot || b.src[0].offset != a.dst.offset)
                               return std::nullopt;
                             // The fused call writes b's result while reading a's sources: not into
                             // one of them.
                             if (b.dst.slot == a.src[0].slot || b.dst.slot == a.src[1].slot)
                               return std::nullopt;
                             if (b.kind == KernelCall::Kind::select &&
                                 (b.dst.slot == b.src[1].slot || b.dst.slot == b.src[2].slot)) {
                               return std::nullopt;
                             }
                             return fuse_pair(q, a, b);
                           });
}

int fuse_elementwise_chains(KernelProgram& p, const backend::Backend& be) {
  return fuse_into_readers(p, chainable, first_reader, [&be](KernelProgram& q, size_t i, size_t r) {
    const std::vector<KernelAddr> outs = outputs_of(q.calls[i]);
    std::vector<bool> kept(outs.size());
    for (size_t o = 0; o < outs.size(); ++o) {
      kept[o] = needed_elsewhere(q, outs[o].slot, i, r);
    }
    return fuse_chain(q, be, q.calls[i], q.calls[r], kept);
  });
}

int fuse_matmul_epilogues(KernelProgram& p) {
  // A product fused with its bias may take a relu next: fuse_into_readers offers it again.
  auto product = [](KernelCall::Kind k) {
    return k == KernelCall::Kind::matmul || k == KernelCall::Kind::matmul_bias;
  };
  return fuse_into_readers(p, product, sole_reader, [](KernelProgram& q, size_t i, size_t r) {
    return fuse_epilogue(q, q.calls[i], q.calls[r]);
  });
}

int fuse_relu_gradients(KernelProgram& p) {
  auto product = [](KernelCall::Kind k) { return k == KernelCall::Kind::matmul; };
  const int fused = fuse_into_readers(p, product, sole_reader, fuse_drelu);
  // The comparisons fused away with their select (and the zeros they read).
  return fused > 0 ? fused + drop_dead_calls(p) : 0;
}

namespace {

// Drops the temporaries no call touches and no result is in (a fused intermediate's), renumbering
// the rest: jit plans no buffer for them.
void drop_unused_temporaries(KernelProgram& p) {
  const size_t nt = p.temp_bytes.size();
  std::vector<char> used(nt, 0);
  auto mark = [&](const KernelAddr& a) {
    if (a.slot >= p.operands) used[static_cast<size_t>(a.slot - p.operands)] = 1;
  };
  for (const KernelCall& c : p.calls) {
    for (int j = 0; j < c.nsrc; ++j) mark(c.src[j]);
    mark(c.dst);
    for (const KernelAddr& m : c.more) mark(m);
  }
  for (const KernelAddr& r : p.results) mark(r);
  std::vector<int32_t> to(nt, -1);
  std::vector<size_t> bytes;
  for (size_t t = 0; t < nt; ++t) {
    if (!used[t]) continue;
    to[t] = p.operands + static_cast<int32_t>(bytes.size());
    bytes.push_back(p.temp_bytes[t]);
  }
  if (bytes.size() == nt) return;
  auto move = [&](KernelAddr& a) {
    if (a.slot >= p.operands) a.slot = to[static_cast<size_t>(a.slot - p.operands)];
  };
  for (KernelCall& c : p.calls) {
    for (int j = 0; j < c.nsrc; ++j) move(c.src[j]);
    move(c.dst);
    for (KernelAddr& m : c.more) move(m);
  }
  for (KernelAddr& r : p.results) move(r);
  p.temp_bytes = std::move(bytes);
}

}  // namespace

int fuse_kernels(KernelProgram& p, const backend::Backend& be) {
  // Epilogues first: a product's bias add (and relu) then belong to the product, which a chain
  // cannot take; then chains over the other elementwise calls; pairs where a chain was refused.
  int fusions = be.fuses_matmul_bias() ? fuse_matmul_epilogues(p) : 0;
  fusions += be.fuses_matmul_drelu() ? fuse_relu_gradients(p) : 0;
  fusions += fuse_elementwise_chains(p, be);
  if (be.fuses_pairs()) fusions += fuse_elementwise_pairs(p);
  if (fusions > 0) {
    (void)drop_dead_calls(p);
    drop_unused_temporaries(p);
  }
  return fusions;
}

KernelRecord record_kernels(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    const std::vector<Tensor>& operands) {
  if (operands.empty()) return refused("no operands");
  for (const Tensor& t : operands) {
    if (!t.valid()) return refused("an operand this process does not hold");
    if (t.device() != operands.front().device()) return refused("operands on several devices");
  }
  const Device dev = operands.front().device();
  backend::Backend& real = backend_of(dev);
  KernelRecorder recorder(real, dev.local_index(), operands);
  std::vector<Tensor> outs;
  {
    RecorderScope scope(&recorder);
    outs = fn(operands);
  }
  if (!recorder.refused().empty()) return refused(recorder.refused());
  KernelProgram& p = recorder.program();
  for (const Tensor& y : outs) {
    if (!y.valid() || y.device() != dev) return refused("a result on another device");
    std::optional<KernelAddr> a = recorder.find(y.data());
    if (!a) return refused("a result the function did not allocate");
    if (a->slot < p.operands) return refused("a result that views an operand");
    p.results.push_back(*a);
    p.result_shapes.push_back(y.shape());
    p.result_dtypes.push_back(y.dtype());
  }
  auto checked = [&](const KernelProgram& q) {
    return reproduces(q, real, dev.local_index(), operands, outs, 0x00) &&
           reproduces(q, real, dev.local_index(), operands, outs, 0xff);
  };
  // Fused epilogues, chains and pairs where the platform fuses them and the program has them,
  // kept only when they give fn's bits too.
  if (config::jit_fusion()) {
    KernelProgram fused = p;
    if (fuse_kernels(fused, real) > 0) {
      if (checked(fused)) {
        return KernelRecord{std::make_shared<const KernelProgram>(std::move(fused)), ""};
      }
      // jit's step merging must not fuse these calls again without this check.
      p.fusion_refused = true;
    }
  }
  if (!checked(p)) {
    return refused(
        "the recorded kernels do not reproduce the results (part of the function runs "
        "outside the backend's kernels)");
  }
  return KernelRecord{std::make_shared<const KernelProgram>(std::move(p)), ""};
}

bool loose_operands_share_memory(const std::vector<Tensor>& operands,
                                 const std::vector<char>& loose, const std::vector<int>& value) {
  for (size_t i = 0; i < operands.size(); ++i) {
    if (!loose[i] || !operands[i].valid()) continue;
    const char* a = static_cast<const char*>(operands[i].data());
    const size_t na = std::max<size_t>(operands[i].nbytes(), 1);
    for (size_t j = 0; j < i; ++j) {
      if (!loose[j] || !operands[j].valid() || value[j] == value[i]) continue;
      const char* b = static_cast<const char*>(operands[j].data());
      const size_t nb = std::max<size_t>(operands[j].nbytes(), 1);
      if (a < b + nb && b < a + na) return true;
    }
  }
  return false;
}

backend::Backend* kernel_tape_for(backend::Backend& real) {
  KernelRecorder* t = t_recorder;
  return t != nullptr && &t->real() == &real ? t : nullptr;
}

}  // namespace meshrt::detail
