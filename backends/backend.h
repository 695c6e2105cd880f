// backends/backend.h: what a platform provides to the layers above it.
//
// A backend owns its devices' memory and executors and knows how to copy bytes. It knows
// nothing about meshes, shardings or tensors; devices are its local indices 0..n-1.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backends/op_codes.h"
#include "core/dtype.h"

namespace meshrt::backend {

class Backend;
class NativeComm;  // backends/native_comm.h

// ---- kernel vocabulary (device-local ops)

// UnaryOp, BinaryOp, ReduceOp, FoldOp: backends/op_codes.h (shared with the CUDA kernels).

// An operand of an elementwise kernel: device memory and one stride (in elements) per output
// dimension; 0 broadcasts. Outputs are dense and row-major.
struct Strided {
  const void* data;
  std::vector<int64_t> strides;
};

// Pass as a device index to copy_2d for memory that is ordinary host memory.
inline constexpr int kHost = -1;

// One pitched copy between two devices of one backend (copy_2d's arguments, no host side).
struct DeviceCopy {
  void* dst;
  int dst_device;
  size_t dpitch;
  const void* src;
  int src_device;
  size_t spitch;
  size_t width;
  size_t height;
};

// An elementwise chain (Backend::elementwise_chain): ops over values, each the result of one
// elementwise kernel as its own call computes it. Values 0 .. inputs-1 are the chain's inputs;
// value inputs + i is op i's result, an intermediate the chain never writes to memory unless it is
// one of the chain's outputs. The last op's result is always the last output; `outputs` may name
// earlier results to write too (adam's m and v, read again by the parameter's update in the same
// chain). Every value has the outputs' shape (inputs read through their Strided, intermediates
// element for element).
// A constant op is a scalar the program fills (a weakly typed `0.9 * m`): `value` as fill() stores
// it in `out`, read broadcast; it reads nothing, and is never an output.
struct ChainOp {
  enum class Kind : uint8_t { unary, binary, select, constant };
  Kind kind = Kind::unary;
  int op = 0;  // UnaryOp (unary: copy with in != out is astype) or BinaryOp (binary)
  // unary/binary: as the kernel's (comparisons write bool); select: the values' dtype in both
  // (its condition, src[0], is bool); constant: out is its dtype.
  DType in = DType::f32, out = DType::f32;
  int src[3] = {0, 0, 0};  // unary reads src[0], binary src[0..1], select src[0..2]
  double value = 0;        // constant
  int reads() const {
    return kind == Kind::unary ? 1 : kind == Kind::binary ? 2 : kind == Kind::select ? 3 : 0;
  }
};

struct ElementwiseChain {
  // The most outputs a chain has.
  static constexpr size_t kMaxOutputs = 8;
  int inputs = 0;
  std::vector<DType> input_dtypes;  // per input
  std::vector<ChainOp> ops;         // in order; the last one's result is the last output
  // Values written to memory, one per destination, in order: op results (>= inputs), distinct,
  // the last op's last. Empty: the last op's result alone.
  std::vector<int> outputs;
  size_t output_count() const { return outputs.empty() ? 1 : outputs.size(); }
  int output(size_t k) const {
    return outputs.empty() ? inputs + static_cast<int>(ops.size()) - 1 : outputs[k];
  }
  // Whether every output is an op's result other than a constant's, the last output the last
  // op's (what every platform's chain relies on).
  bool outputs_valid() const {
    const int nops = static_cast<int>(ops.size());
    if (nops == 0 || output(output_count() - 1) != inputs + nops - 1) return false;
    for (size_t k = 0; k < output_count(); ++k) {
      const int v = output(k);
      if (v < inputs || v >= inputs + nops ||
          ops[static_cast<size_t>(v - inputs)].kind == ChainOp::Kind::constant) {
        return false;
      }
    }
    return true;
  }
  // The dtype of value v (an input's, or the op's output).
  DType value_dtype(int v) const {
    return v < inputs ? input_dtypes[static_cast<size_t>(v)]
                      : ops[static_cast<size_t>(v - inputs)].out;
  }
};

// A block of one device's memory, freed by its backend when the last reference goes.
// Bytes held by live Buffers, process-wide, and the most held at once since the last reset.
void note_buffer_bytes(int64_t delta);
int64_t buffer_bytes_in_use();
int64_t buffer_bytes_peak();
void reset_buffer_bytes_peak();

class Buffer {
 public:
  Buffer(Backend* backend, int device, void* data, size_t bytes)
      : backend_(backend), device_(device), data_(data), bytes_(bytes) {
    note_buffer_bytes(static_cast<int64_t>(bytes));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  Backend& backend() const { return *backend_; }

 private:
  Backend* backend_;
  int device_;
  void* data_;
  size_t bytes_;
};

// A non-owning reference to a callable taking nothing (Backend::run_graph's body): no
// allocation per call on jit's replay path. The callable must outlive the call it is passed to.
class BodyRef {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::remove_cv_t<F>, BodyRef>>>
  BodyRef(F& f) : obj_(&f), call_([](void* o) { (*static_cast<F*>(o))(); }) {}  // NOLINT
  void operator()() const { call_(obj_); }

 private:
  void* obj_;
  void (*call_)(void*);
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view platform() const = 0;
  // Devices this backend can use now (0 when the platform is built but has no hardware).
  virtual int device_count() const = 0;
  // Why device_count() is 0, for error messages ("" when devices exist).
  virtual std::string unavailable_reason() const = 0;
  // True when device memory is ordinary host memory (cpu): host code reads and writes it
  // directly, and the collective primitives below take effect before they return, so callers
  // may skip coll_begin, coll_fence and progress tokens (collectives/plane.h does: no call at
  // all on the cpu latency path). Fixed for the backend's life.
  bool host_addressable() const { return host_memory_; }

  // Allocates `bytes` on `device` (at least 64-byte aligned). Errors are meshrt::Errors.
  virtual std::shared_ptr<Buffer> allocate(int device, size_t bytes) = 0;
  // Called by ~Buffer.
  virtual void deallocate(int device, void* data, size_t bytes) noexcept = 0;

  // Copies `height` rows of `width` bytes; row r starts at src + r*spitch and dst + r*dpitch
  // (cudaMemcpy2D semantics). A device index of kHost marks host memory. With host memory on
  // either side it is synchronous; between devices a device platform may queue it in order
  // with both devices' later work (cuda does: backends/cuda/cuda_backend.h).
  virtual void copy_2d(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
                       size_t spitch, size_t width, size_t height) = 0;

  // Copies between devices of this backend, each with copy_2d's ordering, issued together (a
  // resharding's copies). No copy's destination may overlap another copy's source or destination.
  // The default calls copy_2d for each; a device platform orders the batch once against the
  // devices involved and moves it in one launch (cuda: backends/cuda/copy_kernels.h).
  virtual void copy_2d_batch(const std::vector<DeviceCopy>& copies);

  // ---- kernels, run on the calling thread against `device`'s memory (cpu: host pointers).
  // y = op(x) elementwise over `shape`, converting in -> out (copy with in != out is astype).
  virtual void unary(int device, UnaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
                     const Strided& x, void* y) = 0;
  // y = op(a, b); comparisons write bool.
  virtual void binary(int device, BinaryOp op, DType in, DType out,
                      const std::vector<int64_t>& shape, const Strided& a, const Strided& b,
                      void* y) = 0;
  // Two elementwise ops fused (jit's compiled steps: runtime/detail/kernel_tape.h), with the
  // bits of the two ops one after the other: y = uop(bop(a, b)) in one dtype (bop not a
  // comparison), and y = cmp(x0, x1) ? a : b (cmp a comparison over `in`; a, b and y of `dtype`).
  // The defaults run the two kernels through a temporary; a platform overrides them to skip it,
  // and says so with fuses_pairs() (jit fuses only then).
  virtual void binary_unary(int device, BinaryOp bop, UnaryOp uop, DType dtype,
                            const std::vector<int64_t>& shape, const Strided& a, const Strided& b,
                            void* y);
  virtual bool fuses_pairs() const { return false; }
  virtual void compare_select(int device, BinaryOp cmp, DType in, DType dtype,
                              const std::vector<int64_t>& shape, const Strided& x0,
                              const Strided& x1, const Strided& a, const Strided& b, void* y);
  // An elementwise chain in one call (jit's compiled steps: fuse_elementwise_chains in
  // runtime/detail/kernel_tape.h): ys[k] = the chain's output k over `shape`, from `inputs` (one
  // per chain input), with the bits of its ops run one after the other as their own kernels. Each
  // y is dense and overlaps no other y and no input, except an input read only densely, where that
  // y is written (a donated operand updated in place): an element is written only after every read
  // of that element. The default runs the ops as their kernels through temporaries; a platform
  // that keeps the intermediates out of memory overrides it and says which chains it takes with
  // fuses_chain() (jit fuses only those).
  virtual void elementwise_chain(int device, const ElementwiseChain& chain,
                                 const std::vector<int64_t>& shape, std::span<const Strided> inputs,
                                 std::span<void* const> ys);
  virtual bool fuses_chain(const ElementwiseChain& /*chain*/) const { return false; }
  // A layer's product and its epilogue in one call (jit's compiled steps): y = a @ b + bias, then
  // relu when `relu`, for one row-major (m, n) float product (matmul_prec's operands, transposes
  // and precision) whose every row gets the n elements of `bias` added. The default runs the
  // product into y, then the bias add (with relu: binary_unary) over y in place: the unfused
  // calls' bits. A platform with a fused epilogue overrides it and says so with
  // fuses_matmul_bias() (jit fuses only then).
  virtual void matmul_bias(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                           bool trans_a, const void* b, bool trans_b, Precision precision,
                           const void* bias, bool relu, void* y);
  virtual bool fuses_matmul_bias() const { return false; }
  // How many matmul_bias calls so far added their bias in the product's epilogue (relu may
  // still be a kernel of its own; the rest ran the unfused calls): tests and reports see whether
  // the fusion happened, not only that the bits agree.
  virtual int64_t fused_matmul_bias_calls() const { return 0; }
  // A layer's product and relu's gradient after it in one call (jit's compiled steps, the
  // backward of a dense layer with relu): y = where(relu_out > 0, a @ b, 0) for one row-major
  // (m, n) float product (operands, transposes and precision as matmul_bias's), relu_out being the
  // forward's relu output, dense (m, n). The default runs the product into y, then the comparison
  // and the select (compare_select) over y in place: the unfused calls' bits. A platform with a
  // fused form overrides it and says so with fuses_matmul_drelu() (jit fuses only then).
  virtual void matmul_drelu(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                            bool trans_a, const void* b, bool trans_b, Precision precision,
                            const void* relu_out, void* y);
  // matmul_drelu's unfused calls with `zero` a float32 +0.0 in device memory (a platform keeping
  // one calls it without allocating).
  void matmul_drelu_unfused(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                            bool trans_a, const void* b, bool trans_b, Precision precision,
                            const void* relu_out, const void* zero, void* y);
  virtual bool fuses_matmul_drelu() const { return false; }
  // How many matmul_drelu calls so far applied relu's gradient in the product's epilogue (the
  // rest ran the unfused calls).
  virtual int64_t fused_matmul_drelu_calls() const { return 0; }
  // Runs `body`, which queues work for `device` only and which, given the same `key` and the
  // same `count` addresses (every address its work touches), queues the same work with the same
  // arguments on every call (jit's compiled steps: KernelProgram::run_as_graph). A platform with
  // work graphs (cuda: CUDA graphs, MESHRT_CUDA_GRAPHS=1) may capture body's work once per key
  // and address set and launch it again as one graph instead of calling body; body must then
  // neither allocate nor wait on the host (a capture that does is dropped and body runs as
  // usual). Returns whether a graph was launched. The default runs body.
  virtual bool run_graph(int device, uint64_t key, const void* const* addresses, size_t count,
                         BodyRef body) {
    (void)device, (void)key, (void)addresses, (void)count;
    body();
    return false;
  }
  // How many graphs run_graph launched so far (tests and reports: whether graphs ran at all).
  virtual int64_t graph_launches() const { return 0; }
  // y = cond ? a : b (cond is bool).
  virtual void select(int device, DType dtype, const std::vector<int64_t>& shape,
                      const Strided& cond, const Strided& a, const Strided& b, void* y) = 0;
  // x is dense [outer, len, inner]; y is dense [outer, inner] (argmax writes int64).
  virtual void reduce(int device, ReduceOp op, DType dtype, int64_t outer, int64_t len,
                      int64_t inner, const void* x, void* y) = 0;
  // c[b] = a[b] @ b[b] for `batch` dense row-major (m, k) x (k, n) matrices.
  virtual void matmul(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                      const void* a, const void* b, void* c) = 0;
  // The same with either operand read transposed: a is stored (m, k), or (k, m) with trans_a; b
  // is stored (k, n), or (n, k) with trans_b (per batch entry, dense). The default copies a
  // transposed operand to a temporary first; a platform overrides it with its BLAS's transposed
  // products (no copy).
  virtual void matmul_t(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                        const void* a, bool trans_a, const void* b, bool trans_b, void* c);
  // matmul_t at a precision other than Precision::highest (tf32: tensor cores round f32 operands
  // to TF32 and accumulate in f32). The default computes matmul_t in full precision (cpu: what
  // was asked is allowed, never required); a platform with tensor cores overrides it.
  virtual void matmul_prec(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                           const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                           Precision precision);
  // A product through the entry point that serves it: matmul_prec for float32 at a precision
  // other than highest, matmul for operands read as stored, else matmul_t. The ops, jit's
  // recorded programs and matmul_bias's default all call it, so a product takes one path (and
  // gives one set of bits) wherever it runs.
  void product(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
               const void* a, bool trans_a, const void* b, bool trans_b, void* c,
               Precision precision);
  // y[i] = value (converted to dtype), or y[i] = i when iota.
  virtual void fill(int device, DType dtype, int64_t n, double value, bool iota, void* y) = 0;

  // Waits until every kernel and copy queued for `device` so far (its compute and its
  // communication work) is complete, and raises a failure of that queued work as a meshrt::Error
  // (Array/Tensor::block_until_ready). On a host_addressable() platform kernels are complete when
  // they return, and the default returns at once; a device platform must override it.
  virtual void synchronize(int device);

  // Runs `task` on the device's executor, in submission order. Returns at once; the task must
  // not throw (callers wrap it and carry exceptions back themselves).
  virtual void submit(int device, std::function<void()> task) = 0;
  // Lets a thread that waits for tasks it submitted run them itself until done != 0, where the
  // executor allows it (cpu's fibers: core::FiberPool::drive). False when it cannot: then the
  // caller waits as usual.
  virtual bool drive(int /*device*/, const std::atomic<uint32_t>& /*done*/) { return false; }
  // Optional first step of drive(), before submitting: keeps the submissions from waking the
  // executor's own thread. A true answer must be followed by drive() on the same thread.
  virtual bool claim(int /*device*/) { return false; }

  // ---- collective primitives: the data movement every collective algorithm is written against
  // (collectives/plane.h). `device` is the member doing the work; pointers may belong to any
  // device of this backend (peers' buffers). A device platform queues the work in order on the
  // device's communication stream, and coll_fence waits until it is done and visible to peers
  // and the host; on a host_addressable() platform each call completes before it returns. The
  // defaults throw: a platform without them cannot run collectives.
  // Before a device joins a collective: its earlier work (which produced the inputs, and any use
  // of the memory the outputs reuse) is complete.
  virtual void coll_begin(int device);
  // coll_begin without a host wait: a token marking everything queued so far on the device's
  // compute stream (its input's producers, the last users of its output's memory), for the
  // stream that runs the collective to wait on (coll_wait_token) before touching either; recycled
  // with coll_release_token. The default calls coll_begin and returns null (nothing to wait on).
  virtual void* coll_begin_token(int device);
  virtual void coll_copy_2d(int device, void* dst, size_t dpitch, const void* src, size_t spitch,
                            size_t width, size_t height);
  virtual void coll_zero(int device, void* dst, size_t bytes);
  // dst[e] = fold(op, srcs[0][e], srcs[1][e], ...) in srcs order (dst may alias a source).
  virtual void coll_fold(int device, FoldOp op, DType in, DType out, void* dst,
                         const std::vector<const void*>& srcs, int64_t len);
  // The same over `rows` rows of `len` elements (sum, max, min; in and out `dtype`): row r of dst
  // starts `r * dpitch` elements after dst, of each source `r * spitch` after it. The default
  // folds row by row; a GPU does it in one launch.
  virtual void coll_fold_rows(int device, FoldOp op, DType dtype, void* dst, int64_t dpitch,
                              const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                              int64_t rows);
  // One fold written to several outputs: dsts[k][e] = fold(op, srcs[*][e]) for every k, the
  // same bits in each (a direct psum's result into every member's output; an output may alias a
  // source). The default folds into dsts[0] with coll_fold and copies it to the others; the cpu
  // platform does so a cache-sized tile at a time, or streams a large call's lines to every
  // output (backends/cpu/coll_primitives.h, fold_to); a GPU reads every source once and writes
  // every output in one launch.
  virtual void coll_fold_to(int device, FoldOp op, DType in, DType out,
                            const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                            int64_t len);
  // dst = sum / divisor in `out` (pmean's last step after a sum in the input dtype).
  virtual void coll_mean(int device, DType in, DType out, void* dst, const void* sum, int64_t len,
                         int64_t divisor);
  virtual void coll_fence(int device);
  // Device-side ordering between members, without the host waiting on a stream: coll_signal
  // returns a token marking everything queued so far on the device's communication stream;
  // coll_wait_token makes the device's communication stream wait for a peer's token;
  // coll_release_token recycles one once no stream can still wait on it.
  virtual void* coll_signal(int device);
  virtual void coll_wait_token(int device, void* token);
  virtual void coll_release_token(int device, void* token) noexcept;
  // The device's own later work (its compute stream: op kernels, copies, its next collective)
  // waits for a peer's token, and nothing else does: a collective whose outputs were written
  // (and inputs read) by the work the token marks ends here without a host wait. The default
  // waits on the communication stream and fences (correct, not asynchronous).
  virtual void coll_order_compute(int device, void* token);

  // ---- the platform's vendor collective library (NCCL on cuda), or null where there is none.
  // Owned by the backend and valid as long as it is.
  virtual NativeComm* native_comm() { return nullptr; }
  // Why native_comm() cannot serve `group` (members' device indices in group order; "" when it
  // can): names the missing library when there is none.
  std::string native_unavailable(const std::vector<int>& group);
  // Why the direct and ring algorithms, whose members copy from and fold over peers' buffers,
  // cannot serve `group` ("" when they can; cuda: GPUs without peer access to each other).
  virtual std::string direct_unavailable(const std::vector<int>& group);

 protected:
  // `host_memory`: see host_addressable().
  explicit Backend(bool host_memory) : host_memory_(host_memory) {}

 private:
  const bool host_memory_;
};

// The cpu backend with `device_count` simulated devices. MESHRT_CPU_EXECUTOR picks how they run:
// "threads" (one thread each), "fibers" (fibers on one worker thread per core), or "auto"
// (default: fibers when there are more devices than cores).
std::unique_ptr<Backend> make_cpu_backend(int device_count);
// The cuda backend: real when meshrt was built with CUDA, else a stub with no devices whose
// unavailable_reason() says so.
std::unique_ptr<Backend> make_cuda_backend();
// Whether this build contains the real cuda backend.
bool cuda_backend_built();

}  // namespace meshrt::backend
