// jit's fusion pass: two consecutive compiled device-local steps whose link is a value only the
// second reads become one step, when the merged kernel program has kernels to fuse
// (runtime/detail/kernel_tape.h, fuse_kernels): elementwise chains (every platform that fuses
// them: cpu, and cuda under MESHRT_CUDA_FUSION=chains), a layer's bias add and relu and relu's
// gradient's comparison and select (cuda's pairs), a layer's product with its bias add (and
// relu) (cuda under MESHRT_CUDA_MATMUL=lt). MESHRT_JIT_FUSION=0 turns it off.
#include <algorithm>
#include <utility>
#include <vector>

#include "core/config.h"
#include "global/jit_ir.h"
#include "runtime/detail/platform.h"

namespace meshrt::detail {
namespace {

// The program of `a` then `b`, where b's operand `link` is a's only result: operands a's, then
// b's but the link; temporaries a's, then b's; results b's.
KernelProgram merged_program(const KernelProgram& a, const KernelProgram& b, int link) {
  KernelProgram m;
  const int32_t na = a.operands, nb = b.operands;
  m.operands = na + nb - 1;
  const auto ta = static_cast<int32_t>(a.temp_bytes.size());
  m.temp_bytes = a.temp_bytes;
  m.temp_bytes.insert(m.temp_bytes.end(), b.temp_bytes.begin(), b.temp_bytes.end());
  auto from_a = [&](KernelAddr x) {
    if (x.slot >= na) x.slot = m.operands + (x.slot - na);
    return x;
  };
  const KernelAddr linked = from_a(a.results.front());
  auto from_b = [&](KernelAddr x) {
    if (x.slot == link) return KernelAddr{linked.slot, linked.offset + x.offset};
    if (x.slot < nb) {
      x.slot = na + (x.slot < link ? x.slot : x.slot - 1);
    } else {
      x.slot = m.operands + ta + (x.slot - nb);
    }
    return x;
  };
  m.strides = a.strides;
  const auto shift = static_cast<int>(a.strides.size());
  m.strides.insert(m.strides.end(), b.strides.begin(), b.strides.end());
  for (KernelCall c : a.calls) {
    for (int j = 0; j < c.nsrc; ++j) c.src[j] = from_a(c.src[j]);
    c.dst = from_a(c.dst);
    m.calls.push_back(std::move(c));
  }
  for (KernelCall c : b.calls) {
    for (int j = 0; j < c.nsrc; ++j) c.src[j] = from_b(c.src[j]);
    c.dst = from_b(c.dst);
    if (c.strided >= 0) c.strided += shift;
    m.calls.push_back(std::move(c));
  }
  for (const KernelAddr& r : b.results) m.results.push_back(from_b(r));
  m.result_shapes = b.result_shapes;
  m.result_dtypes = b.result_dtypes;
  return m;
}

// The operand of `b` that reads `a`'s one result at every position, when that is the only read of
// it in the whole program and it is not an output; else -1.
int sole_link(const JitProgram& p, size_t i) {
  const JitStep& a = p.steps[i];
  const JitStep& b = p.steps[i + 1];
  if (a.out.size() != 1) return -1;
  const int v = a.out.front();
  for (const JitOutput& o : p.outputs) {
    for (const Ref& r : o.refs) {
      if (r.vid == v) return -1;
    }
  }
  int link = -1, reads = 0;
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const JitStep& s = p.steps[k];
    for (size_t o = 0; o < s.in.size(); ++o) {
      bool reads_v = false;
      for (size_t pos = 0; pos < s.in[o].size(); ++pos) {
        if (s.in[o][pos].vid != v) continue;
        reads_v = true;
        if (k != i + 1 || s.in[o][pos].pos != static_cast<int>(pos)) return -1;
      }
      if (!reads_v) continue;
      ++reads;
      link = static_cast<int>(o);
    }
  }
  return reads == 1 && b.in[static_cast<size_t>(link)].size() == a.in.front().size() ? link : -1;
}

bool fusable_steps(const JitStep& a, const JitStep& b) {
  return a.kernels() != nullptr && b.kernels() != nullptr && *a.mesh == *b.mesh && !a.in.empty() &&
         a.kernels()->results.size() == 1 && !a.kernels()->fusion_refused &&
         !b.kernels()->fusion_refused;
}

}  // namespace

int jit_fuse_steps(JitProgram& p) {
  if (!config::jit_fusion()) return 0;
  int merged = 0;
  // Passes until nothing merges: a merge can link the step before it to the merged one (the
  // two sides of a + b, each a chain of its own).
  for (bool again = true; again;) {
    again = false;
    for (size_t i = 0; i + 1 < p.steps.size();) {
      JitStep& a = p.steps[i];
      JitStep& b = p.steps[i + 1];
      const int link = fusable_steps(a, b) ? sole_link(p, i) : -1;
      if (link < 0) {
        ++i;
        continue;
      }
      // By platform, not by device: every process of a job plans the same steps.
      const backend::Backend& be = backend_of(a.mesh->devices().front().kind());
      KernelProgram prog = merged_program(*a.kernels(), *b.kernels(), link);
      if (fuse_kernels(prog, be) == 0) {
        ++i;
        continue;
      }
      const LocalStep& la = *a.local();
      const LocalStep& lb = *b.local();
      LocalStep l;
      l.concurrent = la.concurrent || lb.concurrent;
      l.kernels = std::make_shared<const KernelProgram>(std::move(prog));
      const size_t na = a.in.size();
      l.fn = [fa = la.fn, fb = lb.fn, na, link](const std::vector<Tensor>& in) {
        const std::vector<Tensor> ia(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(na));
        std::vector<Tensor> ib(in.begin() + static_cast<std::ptrdiff_t>(na), in.end());
        ib.insert(ib.begin() + link, fa(ia).front());
        return fb(ib);
      };
      JitStep s;
      s.op = std::move(l);
      s.mesh = a.mesh;
      s.in = a.in;
      for (size_t o = 0; o < b.in.size(); ++o) {
        if (static_cast<int>(o) != link) s.in.push_back(b.in[o]);
      }
      s.out = b.out;
      p.steps[i] = std::move(s);
      p.steps.erase(p.steps.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      ++merged;
      again = true;
    }
  }
  return merged;
}

}  // namespace meshrt::detail
