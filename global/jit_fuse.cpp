// jit's fusion pass: two consecutive compiled device-local steps where the second reads results
// of the first (each at its own position) become one step, when the merged kernel program has
// kernels to fuse; results of the first that the program returns or a later step reads stay
// results of the merged step (a chain's extra outputs: adam's m and v), the rest never leave it
// (runtime/detail/kernel_tape.h, fuse_kernels): elementwise chains (every platform that fuses
// them: cpu, and cuda under MESHRT_CUDA_FUSION=chains), a layer's bias add and relu and relu's
// gradient's comparison and select (cuda's pairs), a layer's product with its bias add (and
// relu) (cuda under MESHRT_CUDA_MATMUL=lt). MESHRT_JIT_FUSION=0 turns it off.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "core/config.h"
#include "global/jit_ir.h"
#include "runtime/detail/platform.h"

namespace meshrt::detail {
namespace {

// How the merged step of `a` then `b` reads b's operands: per operand of b, `from[o]` >= 0 is the
// merged step's operand it becomes (a's operands first, b's own after them, one read twice taken
// once), and -1 - r reads a's result r. `kept` marks a's results the merged step still returns
// (the program's outputs, or read by a later step): the rest never leave it.
struct Merge {
  std::vector<int> from;
  std::vector<bool> kept;
  std::vector<size_t> b_own;  // b's operands that become new operands of the merged step, in order
};

// The program of `a` then `b`: operands a's, then b's own (Merge::b_own); temporaries a's, then
// b's; results a's kept ones, then b's.
KernelProgram merged_program(const KernelProgram& a, const KernelProgram& b, const Merge& mg) {
  KernelProgram m;
  const int32_t na = a.operands, nb = b.operands;
  m.operands = na + static_cast<int32_t>(mg.b_own.size());
  const auto ta = static_cast<int32_t>(a.temp_bytes.size());
  m.temp_bytes = a.temp_bytes;
  m.temp_bytes.insert(m.temp_bytes.end(), b.temp_bytes.begin(), b.temp_bytes.end());
  auto from_a = [&](KernelAddr x) {
    if (x.slot >= na) x.slot = m.operands + (x.slot - na);
    return x;
  };
  auto from_b = [&](KernelAddr x) {
    if (x.slot >= nb) {
      x.slot = m.operands + ta + (x.slot - nb);
      return x;
    }
    const int f = mg.from[static_cast<size_t>(x.slot)];
    if (f >= 0) return KernelAddr{f, x.offset};
    const KernelAddr r = from_a(a.results[static_cast<size_t>(-1 - f)]);
    return KernelAddr{r.slot, r.offset + x.offset};
  };
  m.strides = a.strides;
  const auto shift = static_cast<int>(a.strides.size());
  m.strides.insert(m.strides.end(), b.strides.begin(), b.strides.end());
  for (KernelCall c : a.calls) {
    for (int j = 0; j < c.nsrc; ++j) c.src[j] = from_a(c.src[j]);
    c.dst = from_a(c.dst);
    for (KernelAddr& x : c.more) x = from_a(x);
    m.calls.push_back(std::move(c));
  }
  for (KernelCall c : b.calls) {
    for (int j = 0; j < c.nsrc; ++j) c.src[j] = from_b(c.src[j]);
    c.dst = from_b(c.dst);
    for (KernelAddr& x : c.more) x = from_b(x);
    if (c.strided >= 0) c.strided += shift;
    m.calls.push_back(std::move(c));
  }
  for (size_t r = 0; r < a.results.size(); ++r) {
    if (!mg.kept[r]) continue;
    m.results.push_back(from_a(a.results[r]));
    m.result_shapes.push_back(a.result_shapes[r]);
    m.result_dtypes.push_back(a.result_dtypes[r]);
  }
  for (size_t r = 0; r < b.results.size(); ++r) {
    m.results.push_back(from_b(b.results[r]));
    m.result_shapes.push_back(b.result_shapes[r]);
    m.result_dtypes.push_back(b.result_dtypes[r]);
  }
  return m;
}

// How steps i and i + 1 merge (Merge), when b reads at least one of a's results, and every read
// of one is of the same block at the same position, all positions of one result per operand.
std::optional<Merge> plan_merge(const JitProgram& p, size_t i) {
  const JitStep& a = p.steps[i];
  const JitStep& b = p.steps[i + 1];
  const size_t npos = a.in.front().size();
  auto result_of = [&](int vid) {
    const auto at = std::find(a.out.begin(), a.out.end(), vid);
    return at == a.out.end() ? -1 : static_cast<int>(at - a.out.begin());
  };
  Merge mg;
  mg.from.assign(b.in.size(), 0);
  bool linked = false;
  for (size_t o = 0; o < b.in.size(); ++o) {
    const std::vector<Ref>& refs = b.in[o];
    const int r = refs.empty() ? -1 : result_of(refs.front().vid);
    for (size_t pos = 0; pos < refs.size(); ++pos) {
      const int rp = result_of(refs[pos].vid);
      if ((rp >= 0 || r >= 0) &&
          (rp != r || refs[pos].pos != static_cast<int>(pos) || refs.size() != npos)) {
        return std::nullopt;
      }
    }
    if (r >= 0) {
      mg.from[o] = -1 - r;
      linked = true;
      continue;
    }
    // An operand a (or b, earlier) reads too is read once.
    auto same = std::find(a.in.begin(), a.in.end(), refs);
    if (same != a.in.end()) {
      mg.from[o] = static_cast<int>(same - a.in.begin());
      continue;
    }
    int seen = -1;
    for (size_t k = 0; k < mg.b_own.size() && seen < 0; ++k) {
      if (b.in[mg.b_own[k]] == refs) seen = static_cast<int>(a.in.size() + k);
    }
    if (seen < 0) {
      seen = static_cast<int>(a.in.size() + mg.b_own.size());
      mg.b_own.push_back(o);
    }
    mg.from[o] = seen;
  }
  if (!linked) return std::nullopt;
  // a's results the merged step returns: outputs, or read by another step than b.
  mg.kept.assign(a.out.size(), false);
  for (size_t r = 0; r < a.out.size(); ++r) {
    const int v = a.out[r];
    for (const JitOutput& o : p.outputs) {
      for (const Ref& ref : o.refs) mg.kept[r] = mg.kept[r] || ref.vid == v;
    }
    for (size_t k = 0; k < p.steps.size() && !mg.kept[r]; ++k) {
      if (k == i + 1) continue;
      for (const std::vector<Ref>& refs : p.steps[k].in) {
        for (const Ref& ref : refs) mg.kept[r] = mg.kept[r] || ref.vid == v;
      }
    }
  }
  return mg;
}

bool fusable_steps(const JitStep& a, const JitStep& b) {
  return a.kernels() != nullptr && b.kernels() != nullptr && *a.mesh == *b.mesh && !a.in.empty() &&
         !a.kernels()->fusion_refused && !b.kernels()->fusion_refused;
}

// The value of each operand of a step reading `in` that is a one-element float32 constant of the
// program, the same at every position (KernelProgram::operand_scalars); `known` caches them by
// value id.
std::vector<std::optional<double>> constant_scalars(const JitProgram& p,
                                                    const std::vector<std::vector<Ref>>& in,
                                                    std::map<int, std::optional<double>>& known) {
  std::vector<std::optional<double>> out(in.size());
  for (size_t o = 0; o < in.size(); ++o) {
    if (in[o].empty()) continue;
    const int vid = in[o].front().vid;
    const JitValue& v = p.values[static_cast<size_t>(vid)];
    if (!v.constant) continue;
    auto it = known.find(vid);
    if (it == known.end()) {
      std::optional<double> value;
      bool same = true;
      for (const Tensor& t : v.blocks) {  // a position another process holds: an empty Tensor
        if (!t.valid()) continue;
        if (t.dtype() != DType::f32 || t.size() != 1) {
          same = false;
          break;
        }
        const double x = t.item<float>();
        // Bit for bit (+0 and -0 differ; a NaN is never known).
        same =
            same && x == x && (!value || (*value == x && std::signbit(*value) == std::signbit(x)));
        value = x;
      }
      it = known.emplace(vid, same ? value : std::nullopt).first;
    }
    bool whole = true;  // every position reads the one value
    for (const Ref& r : in[o]) whole = whole && r.vid == vid;
    if (whole) out[o] = it->second;
  }
  return out;
}

size_t drelu_calls(const KernelProgram& k) {
  return static_cast<size_t>(std::count_if(k.calls.begin(), k.calls.end(), [](const KernelCall& c) {
    return c.kind == KernelCall::Kind::matmul_drelu;
  }));
}

// Merges steps i and i + 1 into one step when they are compiled, the second reads results of the
// first, and the merged kernel program has kernels to fuse (with `drelu_only`: a product with
// relu's gradient among them). Returns whether it did.
bool merge_at(JitProgram& p, size_t i, std::map<int, std::optional<double>>& known,
              bool drelu_only = false) {
  JitStep& a = p.steps[i];
  JitStep& b = p.steps[i + 1];
  const std::optional<Merge> mg = fusable_steps(a, b) ? plan_merge(p, i) : std::nullopt;
  if (!mg) return false;
  // By platform, not by device: every process of a job plans the same steps.
  const backend::Backend& be = backend_of(a.mesh->devices().front().kind());
  KernelProgram prog = merged_program(*a.kernels(), *b.kernels(), *mg);
  std::vector<std::vector<Ref>> in = a.in;
  for (size_t o : mg->b_own) in.push_back(b.in[o]);
  if (be.fuses_matmul_drelu()) prog.operand_scalars = constant_scalars(p, in, known);
  if (fuse_kernels(prog, be) == 0) return false;
  if (drelu_only && drelu_calls(prog) <= drelu_calls(*b.kernels())) return false;
  const LocalStep& la = *a.local();
  const LocalStep& lb = *b.local();
  LocalStep l;
  l.concurrent = la.concurrent || lb.concurrent;
  l.kernels = std::make_shared<const KernelProgram>(std::move(prog));
  const size_t na = a.in.size();
  l.fn = [fa = la.fn, fb = lb.fn, na, from = mg->from,
          kept = mg->kept](const std::vector<Tensor>& in) {
    const std::vector<Tensor> ia(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(na));
    std::vector<Tensor> ra = fa(ia);
    std::vector<Tensor> ib;
    for (int f : from)
      ib.push_back(f >= 0 ? in[static_cast<size_t>(f)] : ra[static_cast<size_t>(-1 - f)]);
    std::vector<Tensor> out;
    for (size_t r = 0; r < ra.size(); ++r) {
      if (kept[r]) out.push_back(std::move(ra[r]));
    }
    for (Tensor& t : fb(ib)) out.push_back(std::move(t));
    return out;
  };
  JitStep s;
  s.op = std::move(l);
  s.mesh = a.mesh;
  s.in = std::move(in);
  for (size_t r = 0; r < a.out.size(); ++r) {
    if (mg->kept[r]) s.out.push_back(a.out[r]);
  }
  s.out.insert(s.out.end(), b.out.begin(), b.out.end());
  p.steps[i] = std::move(s);
  p.steps.erase(p.steps.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  return true;
}

// Where the platform fuses products with relu's gradient: step i, a compiled product alone, moved
// down to just before the first later step reading its results (no step between reads them) and
// merged with it, when that merge fuses the product with relu's gradient (and no other merge:
// programs that fused nothing new before keep their steps as they were). The backward of a layer
// computes dx = g @ W^T, then dW = x^T @ g, then relu's gradient of dx: dx's product moves past
// dW's. Steps are pure functions of their operands, so the order of independent ones does not
// change what they compute. Returns whether it moved and merged (else the order is as it was).
bool sink_product(JitProgram& p, size_t i, std::map<int, std::optional<double>>& known) {
  const KernelProgram* k = p.steps[i].kernels();
  if (k == nullptr || k->calls.size() != 1 || k->calls.front().kind != KernelCall::Kind::matmul) {
    return false;
  }
  if (!backend_of(p.steps[i].mesh->devices().front().kind()).fuses_matmul_drelu()) return false;
  const std::vector<int>& outs = p.steps[i].out;
  auto reads = [&](const JitStep& s) {
    for (const std::vector<Ref>& refs : s.in) {
      for (const Ref& r : refs) {
        if (std::find(outs.begin(), outs.end(), r.vid) != outs.end()) return true;
      }
    }
    return false;
  };
  size_t j = i + 1;
  while (j < p.steps.size() && !reads(p.steps[j])) ++j;
  if (j == p.steps.size() || j == i + 1) return false;
  const auto at = p.steps.begin();
  std::rotate(at + static_cast<std::ptrdiff_t>(i), at + static_cast<std::ptrdiff_t>(i) + 1,
              at + static_cast<std::ptrdiff_t>(j));
  if (merge_at(p, j - 1, known, true)) return true;
  std::rotate(at + static_cast<std::ptrdiff_t>(i), at + static_cast<std::ptrdiff_t>(j) - 1,
              at + static_cast<std::ptrdiff_t>(j));
  return false;
}

}  // namespace

int jit_fuse_steps(JitProgram& p) {
  if (!config::jit_fusion()) return 0;
  int merged = 0;
  std::map<int, std::optional<double>> known;  // constant scalars read so far, by value id
  // Passes until nothing merges: a merge can link the step before it to the merged one (the
  // two sides of a + b, each a chain of its own).
  for (bool again = true; again;) {
    again = false;
    for (size_t i = 0; i + 1 < p.steps.size();) {
      if (merge_at(p, i, known) || sink_product(p, i, known)) {
        ++merged;
        again = true;
        continue;
      }
      ++i;
    }
  }
  return merged;
}

}  // namespace meshrt::detail
