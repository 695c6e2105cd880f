// The placement rules of the global-view ops: which layout each operand must have when the
// per-device op runs, and which layout the result gets. They reproduce what jax.jit (GSPMD /
// Shardy, Auto axes) gives for one op, except where operands conflict (see merge_candidates).
//
// Which op uses which rule, and which ops keep pending sums (linear), is the Placement and linear
// columns of the op table (runtime/detail/op_registry.cpp); array_ops.cpp calls the rule its
// op's row names.
#include "global/rules.h"

#include <algorithm>

#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/op_registry.h"

namespace meshrt::global {
namespace {

struct Candidate {
  AxisList axes;
  int64_t elements;  // of the operand it comes from
  int operand;
};

// R1: axis lists for one dimension merge when one is a prefix of the other (the longer wins;
// unsharded is the empty prefix). Conflicting lists: jax.jit replicates the dimension and
// all-gathers every operand; meshrt keeps the list of the operand with the most elements (the
// cheapest to keep in place; ties: the first operand) and reshards the others.
Candidate merge_candidates(const std::vector<Candidate>& cands) {
  Candidate chosen{{}, -1, -1};
  for (const Candidate& c : cands) {
    if (chosen.operand < 0) {
      chosen = c;
    } else if (is_prefix(chosen.axes, c.axes)) {
      if (c.axes.size() > chosen.axes.size()) chosen = Candidate{c.axes, c.elements, c.operand};
    } else if (!is_prefix(c.axes, chosen.axes) && c.elements > chosen.elements) {
      chosen = c;
    }
  }
  return chosen;
}

// R2: an axis may shard one dimension only; it stays on the dimension whose source operand has
// more elements (ties: the lower operand index, then the earlier dimension).
void one_dim_per_axis(std::vector<AxisList>& dims, const std::vector<Candidate>& src) {
  for (size_t r = 0; r < dims.size(); ++r) {
    for (size_t q = r + 1; q < dims.size(); ++q) {
      for (size_t k = 0; k < dims[q].size(); ++k) {
        auto hit = std::find(dims[r].begin(), dims[r].end(), dims[q][k]);
        if (hit == dims[r].end()) continue;
        const bool keep_r =
            src[r].elements > src[q].elements ||
            (src[r].elements == src[q].elements && src[r].operand <= src[q].operand);
        if (keep_r) {
          dims[q].resize(k);
        } else {
          dims[r].erase(hit, dims[r].end());
        }
        break;
      }
    }
  }
}

Layout without_partial(Layout l) {
  l.partial.clear();
  return l;
}

AxisList axes_of_dims(const Layout& l, const std::vector<bool>& which) {
  AxisList out;
  for (size_t d = 0; d < l.dims.size(); ++d) {
    if (which[d]) out.insert(out.end(), l.dims[d].begin(), l.dims[d].end());
  }
  return out;
}

}  // namespace

Plan elementwise_rule(const Mesh& mesh, const std::vector<Operand>& xs, const Shape& out_shape,
                      bool linear) {
  const size_t R = out_shape.size();
  std::vector<AxisList> dims(R);
  std::vector<Candidate> src(R, Candidate{{}, 0, 0});
  for (size_t r = 0; r < R; ++r) {
    std::vector<Candidate> cands;
    for (size_t i = 0; i < xs.size(); ++i) {
      const Shape& s = *xs[i].shape;
      const int64_t k = static_cast<int64_t>(r) - static_cast<int64_t>(R - s.size());
      if (k < 0 || s[k] != out_shape[r] || out_shape[r] == 1) continue;
      cands.push_back({xs[i].layout.dims[k], shape_size(s), static_cast<int>(i)});
    }
    if (cands.empty()) continue;
    src[r] = merge_candidates(cands);
    dims[r] = src[r].axes;
  }
  one_dim_per_axis(dims, src);
  Layout out{dims, {}};
  trim_to_divisible(out, out_shape, mesh);

  Plan p;
  bool same_partial = linear && !xs.empty() && !xs.front().layout.partial.empty();
  for (size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = *xs[i].shape;
    Layout need = replicated(s.size());
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t r = k + (R - s.size());
      if (s[k] == out_shape[r] && s[k] != 1) need.dims[k] = out.dims[r];
    }
    same_partial = same_partial && xs[i].layout.partial == xs.front().layout.partial &&
                   xs[i].layout.dims == need.dims;
    p.need.push_back(need);
  }
  if (same_partial) {
    for (Layout& n : p.need) n.partial = xs.front().layout.partial;
    out.partial = xs.front().layout.partial;
  }
  p.out.push_back(out);
  return p;
}

Plan reduce_rule(const Mesh& mesh, const Operand& x, Reduction kind, std::optional<int> axis,
                 bool keepdims) {
  (void)mesh;
  const size_t n = x.shape->size();
  std::vector<bool> reduced(n, !axis.has_value());
  if (axis) reduced[static_cast<size_t>(*axis)] = true;
  Plan p;
  Layout need = x.layout;
  const bool linear = kind == Reduction::sum || kind == Reduction::mean;
  if (!linear) need.partial.clear();
  if (kind == Reduction::argmax) {
    for (size_t d = 0; d < n; ++d) {
      if (reduced[d]) need.dims[d].clear();
    }
  }
  Layout out;
  for (size_t d = 0; d < n; ++d) {
    if (!reduced[d]) {
      out.dims.push_back(need.dims[d]);
    } else if (keepdims) {
      out.dims.emplace_back();
    }
  }
  const AxisList over = axes_of_dims(need, reduced);
  if (linear) {
    out.partial = need.partial;
    out.partial.insert(out.partial.end(), over.begin(), over.end());
  } else if (kind != Reduction::argmax) {
    p.reduce_axes = over;
  }
  p.need.push_back(need);
  p.out.push_back(out);
  return p;
}

Plan gather_dims_rule(const Mesh& mesh, const Operand& x, const std::vector<bool>& whole,
                      const Shape& out_shape) {
  Plan p;
  Layout need = without_partial(x.layout);
  for (size_t d = 0; d < whole.size(); ++d) {
    if (whole[d]) need.dims[d].clear();
  }
  Layout out = without_partial(x.layout);
  trim_to_divisible(out, out_shape, mesh);
  p.need.push_back(need);
  p.out.push_back(out);
  return p;
}

Plan matmul_rule(const Mesh& mesh, const Operand& a, const Operand& b) {
  // Promote 1-D operands: a (k) -> (1, k), b (k) -> (k, 1).
  Layout la = without_partial(a.layout), lb = without_partial(b.layout);
  Shape sa = *a.shape, sb = *b.shape;
  const bool a1 = sa.size() == 1, b1 = sb.size() == 1;
  if (a1) {
    sa.insert(sa.begin(), 1);
    la.dims.insert(la.dims.begin(), AxisList{});
  }
  if (b1) {
    sb.push_back(1);
    lb.dims.emplace_back();
  }
  const size_t ra = sa.size(), rb = sb.size();
  const size_t nb = std::max(ra, rb) - 2;  // batch dims of the result
  const int64_t ea = shape_size(sa), eb = shape_size(sb);
  // Result dims: batch..., m, n (before removing promoted ones).
  const meshrt::detail::MatmulShape ms =
      meshrt::detail::matmul_shape(*a.shape, *b.shape, false, false, "matmul", "[matmul] ");
  Shape full = ms.batch;
  full.push_back(ms.m);
  full.push_back(ms.n);
  std::vector<AxisList> dims(nb + 2);
  std::vector<Candidate> src(nb + 2, Candidate{{}, 0, 0});
  for (size_t r = 0; r < nb; ++r) {
    std::vector<Candidate> cands;
    const int64_t ka = static_cast<int64_t>(r) - static_cast<int64_t>(nb - (ra - 2));
    const int64_t kb = static_cast<int64_t>(r) - static_cast<int64_t>(nb - (rb - 2));
    if (ka >= 0 && sa[ka] == full[r] && full[r] != 1) cands.push_back({la.dims[ka], ea, 0});
    if (kb >= 0 && sb[kb] == full[r] && full[r] != 1) cands.push_back({lb.dims[kb], eb, 1});
    if (!cands.empty()) src[r] = merge_candidates(cands);
    dims[r] = src[r].axes;
  }
  dims[nb] = la.dims[ra - 2];
  src[nb] = {dims[nb], ea, 0};
  dims[nb + 1] = lb.dims[rb - 1];
  src[nb + 1] = {dims[nb + 1], eb, 1};
  one_dim_per_axis(dims, src);
  // Contracting dim: merged like R1; incompatible lists keep their common prefix; an axis a
  // result dim uses cannot also be contracted (that side is gathered instead).
  const AxisList& ka = la.dims[ra - 1];
  const AxisList& kb = lb.dims[rb - 2];
  AxisList kc;
  if (is_prefix(ka, kb)) {
    kc = kb;
  } else if (is_prefix(kb, ka)) {
    kc = ka;
  } else {
    for (size_t i = 0; i < std::min(ka.size(), kb.size()) && ka[i] == kb[i]; ++i)
      kc.push_back(ka[i]);
  }
  for (size_t i = 0; i < kc.size(); ++i) {
    bool used = false;
    for (const AxisList& d : dims) used = used || std::find(d.begin(), d.end(), kc[i]) != d.end();
    if (used) {
      kc.resize(i);
      break;
    }
  }
  Layout out_full{dims, {}};
  trim_to_divisible(out_full, full, mesh);

  Plan p;
  Layout na = replicated(ra), nbl = replicated(rb);
  for (size_t k = 0; k + 2 < ra; ++k) {
    const size_t r = k + (nb - (ra - 2));
    if (sa[k] == full[r] && sa[k] != 1) na.dims[k] = out_full.dims[r];
  }
  for (size_t k = 0; k + 2 < rb; ++k) {
    const size_t r = k + (nb - (rb - 2));
    if (sb[k] == full[r] && sb[k] != 1) nbl.dims[k] = out_full.dims[r];
  }
  na.dims[ra - 2] = out_full.dims[nb];
  na.dims[ra - 1] = kc;
  nbl.dims[rb - 2] = kc;
  nbl.dims[rb - 1] = out_full.dims[nb + 1];
  if (a1) na.dims.erase(na.dims.begin());
  if (b1) nbl.dims.pop_back();
  Layout out = out_full;
  if (b1) out.dims.pop_back();
  if (a1) out.dims.erase(out.dims.begin() + static_cast<int64_t>(nb));
  out.partial = kc;
  p.need = {na, nbl};
  p.out.push_back(out);
  return p;
}

namespace {

int64_t local_elems(const Mesh& mesh, const Shape& s, const Layout& l) {
  int64_t n = 1;
  for (size_t d = 0; d < s.size(); ++d) n *= s[d] / axes_size(mesh, l.dims[d]);
  return n;
}

// Every axis at most once, every dimension divisible by its axes.
bool well_formed(const Mesh& mesh, const Shape& s, const Layout& l) {
  AxisList seen;
  for (size_t d = 0; d < s.size(); ++d) {
    for (const std::string& a : l.dims[d]) {
      if (std::find(seen.begin(), seen.end(), a) != seen.end()) return false;
      seen.push_back(a);
    }
    if (s[d] % axes_size(mesh, l.dims[d]) != 0) return false;
  }
  return true;
}

AxisList minus(const AxisList& a, const AxisList& b) {
  AxisList r;
  for (const std::string& x : a)
    if (std::find(b.begin(), b.end(), x) == b.end()) r.push_back(x);
  return r;
}

AxisList plus(AxisList a, const AxisList& b) {
  for (const std::string& x : b)
    if (std::find(a.begin(), a.end(), x) == a.end()) a.push_back(x);
  return a;
}

// What one more collective costs, in elements: its fixed cost (a launch and a rendezvous, 2-4 us
// on the cpu platform) is about the time 64 KiB take to copy. Small products keep jax.jit's
// placement, which has the fewest collectives.
constexpr int64_t kCollectiveElems = 16 * 1024;

// Elements a device writes for one placement: moved operands, the product, the move to the
// final layout. A partial product counts once: its sum reads it where it is, in address order,
// in about the time the gather of the whole product would take to write it (the tensor-parallel
// MLP's forward product: 12 ms for its psum_scatter against 21 ms to gather the rows' result).
int64_t matmul_cost(const Mesh& mesh, const Shape& sa, const Layout& la, const Shape& sb,
                    const Layout& lb, const Shape& so, const Plan& p, const Layout& final_dims) {
  int64_t c = 0;
  if (p.need[0].dims != la.dims) c += kCollectiveElems + local_elems(mesh, sa, p.need[0]);
  if (p.need[1].dims != lb.dims) c += kCollectiveElems + local_elems(mesh, sb, p.need[1]);
  const Layout& o = p.out.front();
  c += local_elems(mesh, so, o);
  if (!o.partial.empty()) c += kCollectiveElems;  // its sum
  if (o.dims != final_dims.dims) c += kCollectiveElems + local_elems(mesh, so, final_dims);
  return c;
}

}  // namespace

std::optional<MatmulChoice> cheaper_matmul(const Mesh& mesh, const Operand& a, const Operand& b,
                                           const Plan& jax, bool kept) {
  const Shape &sa = *a.shape, &sb = *b.shape;
  if (sa.size() != 2 || sb.size() != 2 || !a.layout.partial.empty() || !b.layout.partial.empty()) {
    return std::nullopt;
  }
  const Layout &la = a.layout, &lb = b.layout;
  const Shape so{sa[0], sb[1]};
  Layout final_dims = jax.out.front();
  final_dims.partial.clear();
  const int64_t jax_cost = matmul_cost(mesh, sa, la, sb, lb, so, jax, final_dims);
  std::optional<MatmulChoice> best;
  auto consider = [&](Plan p, const char* form, bool deferred) {
    if (!well_formed(mesh, sa, p.need[0]) || !well_formed(mesh, sb, p.need[1]) ||
        !well_formed(mesh, so, p.out.front())) {
      return;
    }
    // Deferred: the rows stay until the sum is taken, then move once (an all_to_all into a
    // sharded layout, the usual taker: the bias add after a tensor-parallel layer).
    const int64_t c = deferred ? matmul_cost(mesh, sa, la, sb, lb, so, p, p.out.front()) +
                                     kCollectiveElems + local_elems(mesh, so, p.out.front())
                               : matmul_cost(mesh, sa, la, sb, lb, so, p, final_dims);
    if (4 * c < 3 * jax_cost && (!best || c < best->cost)) {
      best = MatmulChoice{std::move(p), form, c, jax_cost, deferred};
    }
  };
  // rows: the contraction's axes onto the lhs rows, the rhs whole along them.
  const AxisList k = plus(la.dims[1], lb.dims[0]);
  if (!k.empty()) {
    Plan p;
    const AxisList m = plus(la.dims[0], k);
    p.need = {Layout{{m, {}}, {}}, Layout{{{}, minus(lb.dims[1], m)}, {}}};
    p.out = {Layout{{m, minus(lb.dims[1], m)}, {}}};
    // A deferred pending sum: the rule's result is a pending sum over exactly the rows' new axis
    // and is otherwise laid out as the rows (one axis: each device's addend is its rows).
    const Layout& j = jax.out.front();
    const bool deferred = !j.partial.empty() && m == k && k.size() == 1 && j.partial == k &&
                          j.dims[0].empty() && j.dims[1] == p.out.front().dims[1];
    if (j.partial.empty() || deferred) consider(std::move(p), "rows", deferred);
  }
  // split_k: axes on both the lhs rows and the rhs columns onto the contraction.
  AxisList both;
  for (const std::string& x : la.dims[0])
    if (std::find(lb.dims[1].begin(), lb.dims[1].end(), x) != lb.dims[1].end()) both.push_back(x);
  if (!both.empty() && la.dims[1] == lb.dims[0]) {
    Plan p;
    const AxisList kk = plus(la.dims[1], both);
    p.need = {Layout{{minus(la.dims[0], both), kk}, {}}, Layout{{kk, minus(lb.dims[1], both)}, {}}};
    p.out = {Layout{{minus(la.dims[0], both), minus(lb.dims[1], both)}, kk}};
    consider(std::move(p), "split_k", false);
  }
  // split_k onto one operand's contraction axes: the other operand's contraction moved there
  // (the first layer's weight gradient x.T @ dz with dz kept as rows: x moves, dz stays).
  if (kept && jax.out.front().partial.empty()) {
    for (const AxisList& kk : {la.dims[1], lb.dims[0]}) {
      if (kk.empty() || (la.dims[1] == kk && lb.dims[0] == kk)) continue;
      Plan p;
      p.need = {Layout{{minus(la.dims[0], kk), kk}, {}}, Layout{{kk, minus(lb.dims[1], kk)}, {}}};
      p.out = {Layout{{minus(la.dims[0], kk), minus(lb.dims[1], kk)}, kk}};
      consider(std::move(p), "split_k", false);
    }
  }
  // in place: the rule applied to where the operands are (one kept as rows by an earlier
  // product; where that is what their shardings show, it is `jax` and costs the same).
  if (jax.out.front().partial.empty()) consider(matmul_rule(mesh, a, b), "in place", false);
  return best;
}

Plan transpose_rule(const Operand& x, const std::vector<int>& perm) {
  Plan p;
  p.need.push_back(x.layout);
  Layout out;
  for (int d : perm) out.dims.push_back(x.layout.dims[static_cast<size_t>(d)]);
  out.partial = x.layout.partial;
  p.out.push_back(out);
  return p;
}

Plan reshape_rule(const Mesh& mesh, const Operand& x, const Shape& out_shape) {
  const Shape& in = *x.shape;
  Layout need = x.layout;  // pending sums stay: reshape is linear
  Layout out = replicated(out_shape.size());
  out.partial = x.layout.partial;
  std::vector<size_t> I, O;  // dims of size != 1
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] != 1)
      I.push_back(d);
    else
      need.dims[d].clear();
  }
  for (size_t d = 0; d < out_shape.size(); ++d) {
    if (out_shape[d] != 1) O.push_back(d);
  }
  size_t i = 0, j = 0;
  while (i < I.size() && j < O.size()) {
    // One group: the fewest leading dims on each side with equal products.
    const size_t i0 = i, j0 = j;
    int64_t pi = in[I[i]], pj = out_shape[O[j]];
    while (pi != pj) {
      if (pi < pj)
        pi *= in[I[++i]];
      else
        pj *= out_shape[O[++j]];
    }
    // The group's axes, major first, kept while each input dim before is split whole (so every
    // device's block stays one contiguous range), then dealt out to the output dims in order:
    // an output dim takes axes while their product divides it, and the next output dim starts
    // only when the previous one is split whole. Axes left over are gathered.
    AxisList collected;
    std::vector<size_t> from;  // input dim of each collected axis
    for (size_t k = i0; k <= i; ++k) {
      for (const std::string& a : need.dims[I[k]]) {
        collected.push_back(a);
        from.push_back(k);
      }
      if (axes_size(mesh, need.dims[I[k]]) != in[I[k]]) break;
    }
    size_t jj = j0, taken = 0;
    int64_t cur = 1;
    while (taken < collected.size()) {
      const int64_t sz = mesh.axis_size(collected[taken]);
      if (out_shape[O[jj]] % (cur * sz) == 0) {
        out.dims[O[jj]].push_back(collected[taken++]);
        cur *= sz;
      } else if (cur == out_shape[O[jj]] && jj < j) {
        ++jj;
        cur = 1;
      } else {
        break;
      }
    }
    for (size_t k = i0; k <= i; ++k) need.dims[I[k]].clear();
    for (size_t t = 0; t < taken; ++t) need.dims[I[from[t]]].push_back(collected[t]);
    ++i;
    ++j;
  }
  if (need.dims != x.layout.dims) {
    need.partial.clear();
    out.partial.clear();
  }
  Plan p;
  p.need.push_back(need);
  p.out.push_back(out);
  return p;
}

Plan join_rule(const Mesh& mesh, const std::vector<Operand>& xs, int axis, bool stack,
               const Shape& out_shape) {
  const size_t n = xs.front().shape->size();
  Plan p;
  Layout out = replicated(out_shape.size());
  std::vector<Candidate> src(n, Candidate{{}, 0, 0});
  std::vector<AxisList> dims(n);
  for (size_t d = 0; d < n; ++d) {
    std::vector<Candidate> cands;
    for (size_t i = 0; i < xs.size(); ++i) {
      if ((*xs[i].shape)[d] == 1 && (stack || static_cast<int>(d) != axis)) continue;
      cands.push_back({xs[i].layout.dims[d], shape_size(*xs[i].shape), static_cast<int>(i)});
    }
    if (!cands.empty()) src[d] = merge_candidates(cands);
    dims[d] = src[d].axes;
  }
  one_dim_per_axis(dims, src);
  for (size_t i = 0; i < xs.size(); ++i) {
    Layout need{dims, {}};
    if (!stack) need.dims[static_cast<size_t>(axis)].clear();
    for (size_t d = 0; d < n; ++d) {
      if ((*xs[i].shape)[d] == 1 && (stack || static_cast<int>(d) != axis)) need.dims[d].clear();
    }
    p.need.push_back(need);
  }
  if (stack) {
    dims.insert(dims.begin() + axis, AxisList{});
  }
  out.dims = dims;
  trim_to_divisible(out, out_shape, mesh);
  p.out.push_back(out);
  return p;
}

}  // namespace meshrt::global
