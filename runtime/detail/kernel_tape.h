// runtime/detail/kernel_tape.h: the backend kernels a device-local function calls, recorded once
// and replayed without the Tensor ops around them (jit's compiled steps; not installed).
//
// record_kernels(fn, operands) runs fn once on the calling thread while backend_of() hands out a
// recording stand-in for the operands' backend: every kernel call is forwarded and written down,
// its addresses as slots (an operand, or a buffer fn allocated: a temporary or a result) plus a
// byte offset. The result is a straight-line program of kernel calls that computes fn's results
// from any operands of the same shapes and dtypes, with no shape checks, no Tensor objects and
// buffers the caller provides (jit plans them once and reuses them on every call).
//
// The recording is refused, with the reason, when fn did anything a straight-line program cannot
// repeat: a collective primitive, a copy from or to the host, an executor task, an address that
// is neither an operand's nor one fn allocated, work on another device, a result that views an
// operand. A program is only kept after it was run twice into buffers filled with two different
// byte patterns and gave fn's results bit for bit both times (read back through the backend's
// copies on a device platform): a kernel the recorder missed leaves a pattern behind.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "runtime/tensor.h"

namespace meshrt::detail {

// An address inside a program: `slot` < operands is operand `slot`, else temporary
// `slot - operands`; `offset` in bytes from its start.
struct KernelAddr {
  int32_t slot = 0;
  int64_t offset = 0;
};

struct KernelCall {
  // binary_unary: op2(op(src0, src1)); compare_select: op(src0, src1) ? src2 : src3 (src0/1 of
  // `in`, the rest and dst of `out`): fused pairs (fuse_elementwise_pairs). matmul_bias: src0 @
  // src1 + the row src2, relu'd when op2 is 1 (op and arg as matmul's, batch 1):
  // fuse_matmul_epilogues. chain: `chain`'s ops over src0 .. src(nsrc-1), its inputs, into dst
  // (in/out: the last output's dtype; `more` the outputs before it): fuse_elementwise_chains.
  // matmul_drelu: where(src2 > 0, src0 @ src1, 0), src2 the forward's relu output (op and arg as
  // matmul's, batch 1): fuse_matmul_epilogues.
  enum class Kind : uint8_t {
    unary,
    binary,
    select,
    reduce,
    matmul,
    fill,
    copy,
    binary_unary,
    compare_select,
    matmul_bias,
    chain,
    matmul_drelu
  };
  // The most sources a call has (a chain's inputs).
  static constexpr int kMaxSources = 16;
  Kind kind = Kind::unary;
  int op = 0;   // UnaryOp, BinaryOp or ReduceOp; matmul: 1 transposes a, 2 transposes b, 4 tf32
  int op2 = 0;  // binary_unary: the UnaryOp
  DType in = DType::f32, out = DType::f32;
  bool iota = false;
  int nsrc = 0;
  KernelAddr src[kMaxSources];
  KernelAddr dst;
  // chain: where the chain's outputs before the last go (chain->outputs but the last), in order.
  std::vector<KernelAddr> more;
  int strided = -1;  // unary/binary/select/chain: the first of nsrc Strided scratch entries
  std::vector<int64_t> shape;
  // reduce: outer, len, inner; matmul: batch, m, n, k; fill: n; copy: width, height, dpitch,
  // spitch (bytes)
  int64_t arg[4] = {0, 0, 0, 0};
  double value = 0;
  std::shared_ptr<const backend::ElementwiseChain> chain;  // chain: its ops

  // Whether the call writes into slot `s` (dst, or one of `more`).
  bool writes(int32_t s) const {
    if (dst.slot == s) return true;
    for (const KernelAddr& m : more) {
      if (m.slot == s) return true;
    }
    return false;
  }
  // Whether the call reads slot `s` as one of its sources.
  bool reads(int32_t s) const {
    for (int j = 0; j < nsrc; ++j) {
      if (src[j].slot == s) return true;
    }
    return false;
  }
};

// An id no other KernelProgram object in this process has had: a copy takes a new one, a move
// takes the source's (and gives the source a new one). A platform caching work per program
// (Backend::run_graph: CUDA graphs) keys on it, so a program built later at a freed program's
// address is never mistaken for it.
class ProgramId {
 public:
  ProgramId() : v_(next()) {}
  ProgramId(const ProgramId&) : v_(next()) {}
  ProgramId(ProgramId&& o) noexcept : v_(o.v_) { o.v_ = next(); }
  ProgramId& operator=(const ProgramId&) {
    v_ = next();
    return *this;
  }
  ProgramId& operator=(ProgramId&& o) noexcept {
    v_ = o.v_;
    o.v_ = next();
    return *this;
  }
  uint64_t value() const { return v_; }

 private:
  static uint64_t next() noexcept;
  uint64_t v_;
};

class KernelProgram {
 public:
  ProgramId id;
  int operands = 0;
  std::vector<size_t> temp_bytes;             // per temporary
  std::vector<KernelCall> calls;              // in order
  std::vector<KernelAddr> results;            // per result of fn: a temporary and an offset
  std::vector<Shape> result_shapes;           // per result
  std::vector<DType> result_dtypes;           // per result
  std::vector<std::vector<int64_t>> strides;  // per Strided scratch entry: its strides
  // Per operand (may be shorter): the value of a one-element float32 operand that never changes
  // (jit's constants: a scalar autodiff made), which fusion may rely on (fuse_relu_gradients).
  std::vector<std::optional<double>> operand_scalars;
  // The recording's fused program did not reproduce the traced bits, so these calls are unfused:
  // jit's step merging leaves the program alone (it could only fuse them again, unchecked).
  bool fusion_refused = false;

  // Fresh scratch for run(): one Strided per entry, strides filled in (one set per thread).
  std::vector<backend::Strided> make_scratch() const;
  // Runs the calls against `device` of `be`; base[s] is slot s's address (operands, then
  // temporaries), `scratch` from make_scratch().
  void run(backend::Backend& be, int device, char* const* base,
           std::vector<backend::Strided>& scratch) const;
  // run() through Backend::run_graph: where the platform has work graphs (CUDA graphs), the
  // calls are captured once per id and slot addresses (base[0 .. operands + temporaries), every
  // address the calls touch) and relaunched as one graph. Returns whether a graph was launched.
  bool run_as_graph(backend::Backend& be, int device, char* const* base,
                    std::vector<backend::Strided>& scratch) const;
  // Kernel calls, for jit's text ("3 kernels").
  size_t size() const { return calls.size(); }
  // Whether temporary `temp` may live in operand `operand`'s memory (a donated input's buffer)
  // and the program still compute the same results: no kernel reads the operand after the first
  // one writing the temporary, and that one reads it, if at all, element for element where it
  // writes (an elementwise kernel over dense operands of one element size: x - lr * g in place).
  bool may_write_over(int operand, size_t temp) const;
};

// Fuses pairs of elementwise calls whose intermediate is a temporary nothing else reads: a
// float32/float64 arithmetic binary op followed by relu or neg of its result (bias + relu), and
// a comparison whose bool result only a select reads (relu's gradient). Each pair becomes one
// call (Backend::binary_unary / compare_select), which gives the pair's bits; the intermediate's
// temporary is no longer written. Returns the number of pairs fused. record_kernels applies it
// where the platform has fused kernels (Backend::fuses_pairs: cuda).
int fuse_elementwise_pairs(KernelProgram& p);

// Fuses chains of elementwise calls (unary, binary, select, and chains already fused) over one
// shape into one call each: a call joins the first later call reading what it writes, moved to
// that call's place (nothing between writes what it reads or writes). What it writes stays an
// output of the chain when the program returns it or another call reads it (adam's m and v, read
// again by the parameter's update: one chain reads g, m, v and p once and writes m, v and p);
// otherwise it is an intermediate that never reaches memory (Backend::elementwise_chain: cpu runs
// it a cache-sized tile at a time, cuda in one kernel). Each op computes as its own kernel, so the
// bits are the unfused program's. A chain grows while the platform takes it
// (Backend::fuses_chain) and has at most KernelCall::kMaxSources inputs, kMaxChainOps ops and
// ElementwiseChain::kMaxOutputs outputs. Returns the number of calls fused away. record_kernels
// and jit's step fusion apply it.
inline constexpr size_t kMaxChainOps = 32;
int fuse_elementwise_chains(KernelProgram& p, const backend::Backend& be);

// Fuses a float32 product with the epilogue a dense layer puts after it, where the product's
// temporary has no other reader and is not a result: `x @ W + b` (b a row added to every row of
// the product) and `relu(x @ W + b)` (the add and relu already one binary_unary, or a fused
// product followed by relu) become one matmul_bias call (Backend::matmul_bias: cuBLASLt's BIAS
// and RELU_BIAS epilogues on cuda). The backend's default runs the same kernels as before, so the
// bits are the unfused program's there. Returns the number of calls fused away. record_kernels
// and jit's step fusion apply it where the platform fuses epilogues (Backend::fuses_matmul_bias).
int fuse_matmul_epilogues(KernelProgram& p);

// Fuses a float32 product with relu's gradient after it, the backward of a dense layer with relu:
// where(y > 0, g @ W^T, 0) as autodiff writes it (both zeros float32 scalars +0.0: a one-element
// fill, or an operand in operand_scalars), the comparison and the select apart or already one
// compare_select, where the product's and the comparison's results have no other reader, becomes
// one matmul_drelu call (Backend::matmul_drelu) reading y. The comparisons left without a reader
// are dropped. The backend's default runs the same kernels as before, so the bits are the unfused
// program's there. Returns the number of calls fused away. record_kernels and jit's step fusion
// apply it where the platform fuses it (Backend::fuses_matmul_drelu).
int fuse_relu_gradients(KernelProgram& p);

// Every fusion the platform `be` has, applied to `p` (epilogues and relu's gradients, chains,
// pairs); the temporaries
// of fused intermediates, no longer written, are dropped (jit plans no buffer for them). Returns
// the number of calls fused away.
int fuse_kernels(KernelProgram& p, const backend::Backend& be);

struct KernelRecord {
  std::shared_ptr<const KernelProgram> program;  // null when refused
  std::string why_not;                           // the reason, when refused
};

// Records fn(operands) on the calling thread (see the top of this file). fn must be a pure
// function of its operands' values (as a LocalFn of the global view is); it is run three times.
KernelRecord record_kernels(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    const std::vector<Tensor>& operands);

// Whether two of `operands` whose values may differ independently from call to call (`loose[i]`
// true: an input or a constant of the caller's program, where a value one op made is a fresh
// buffer or a view that stays a view) share memory now (an Array passed twice, a constant viewing
// an argument's block). record_kernels maps an address to the first operand holding it, so a
// program recorded on them would read one operand for both on a later call: callers do not record
// then. Operands that are one value (x * x) share memory harmlessly and are not loose pairs.
bool loose_operands_share_memory(const std::vector<Tensor>& operands,
                                 const std::vector<char>& loose, const std::vector<int>& value);

// Internal (runtime/device.cpp): the recording stand-in for `real` on this thread, or null.
backend::Backend* kernel_tape_for(backend::Backend& real);

}  // namespace meshrt::detail
