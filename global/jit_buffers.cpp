// jit's buffer pass: which values live in planned buffers (made and read only by compiled steps at
// one position), and the buffers themselves, reused greedily; the replay's flat tables.
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "global/jit_ir.h"
#include "runtime/detail/platform.h"

namespace meshrt::detail {

// Which values live in planned buffers, and the buffers: per mesh, greedily, a buffer of the same
// size freed by an earlier step is reused (a value's buffer is free after its last reader, a
// temporary's after its own step). `last`: each value's last reading step, or -1.
void jit_plan_buffers(JitProgram& p, const std::vector<int>& last) {
  for (JitStep& s : p.steps) {
    if (s.reshard() != nullptr) continue;
    auto it = std::find(p.meshes.begin(), p.meshes.end(), *s.mesh);
    s.mesh_index = static_cast<int>(it - p.meshes.begin());
    if (it == p.meshes.end()) p.meshes.push_back(*s.mesh);
  }
  // Planned: made by a compiled step, read only by compiled steps on the same mesh at the same
  // position (keep_to_end covers the rest: results, reshards, other positions).
  std::vector<int> maker(p.values.size(), -1);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    for (int v : p.steps[i].out) maker[static_cast<size_t>(v)] = static_cast<int>(i);
  }
  for (size_t v = 0; v < p.values.size(); ++v) {
    const int m = maker[v];
    p.values[v].planned =
        m >= 0 && p.steps[static_cast<size_t>(m)].kernels() != nullptr && !p.values[v].keep_to_end;
  }
  for (const JitStep& s : p.steps) {
    for (const auto& refs : s.in) {
      for (const Ref& r : refs) {
        JitValue& v = p.values[static_cast<size_t>(r.vid)];
        if (!v.planned) continue;
        const JitStep& m = p.steps[static_cast<size_t>(maker[static_cast<size_t>(r.vid)])];
        if ((s.kernels() == nullptr && !s.host_psum()) || s.mesh_index != m.mesh_index) {
          v.planned = false;
        }
      }
    }
  }
  // Results sharing a temporary share its fate: one that leaves makes them all leave.
  for (const JitStep& s : p.steps) {
    if (s.kernels() == nullptr) continue;
    const KernelProgram& k = *s.kernels();
    for (size_t r = 0; r < k.results.size(); ++r) {
      for (size_t q = 0; q < k.results.size(); ++q) {
        if (k.results[r].slot == k.results[q].slot &&
            !p.values[static_cast<size_t>(s.out[q])].planned) {
          p.values[static_cast<size_t>(s.out[r])].planned = false;
        }
      }
    }
  }
  p.planned.assign(p.meshes.size(), {});
  std::vector<std::multimap<size_t, int>> free(p.meshes.size());
  std::vector<std::vector<std::pair<int, int>>> release(p.steps.size());  // (mesh, buffer)
  for (size_t i = 0; i < p.steps.size(); ++i) {
    JitStep& s = p.steps[i];
    if (LocalStep* l = s.local(); l != nullptr && l->kernels != nullptr) {
      const KernelProgram& k = *l->kernels;
      const size_t m = static_cast<size_t>(s.mesh_index);
      l->temp_home.assign(k.temp_bytes.size(), 0);
      std::vector<int> until(k.temp_bytes.size(), static_cast<int>(i));
      for (size_t r = 0; r < k.results.size(); ++r) {
        const size_t t = static_cast<size_t>(k.results[r].slot - k.operands);
        const int v = s.out[r];
        if (!p.values[static_cast<size_t>(v)].planned && l->temp_home[t] >= 0) {
          l->temp_home[t] = -1 - static_cast<int>(l->fresh++);
        }
        until[t] = std::max(until[t], last[static_cast<size_t>(v)]);
      }
      for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
        if (l->temp_home[t] < 0) continue;
        const size_t bytes = k.temp_bytes[t];
        auto f = free[m].find(bytes);
        int b = 0;
        if (f != free[m].end()) {
          b = f->second;
          free[m].erase(f);
        } else {
          b = static_cast<int>(p.planned[m].size());
          p.planned[m].push_back(bytes);
        }
        l->temp_home[t] = b;
        release[static_cast<size_t>(until[t])].push_back({static_cast<int>(m), b});
      }
      for (size_t r = 0; r < k.results.size(); ++r) {
        JitValue& v = p.values[static_cast<size_t>(s.out[r])];
        if (!v.planned) continue;
        v.home = l->temp_home[static_cast<size_t>(k.results[r].slot - k.operands)];
        v.home_at = k.results[r].offset;
      }
      // In-place donation: inputs read here for the last time, of a leaving temporary's size.
      for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
        if (l->temp_home[t] >= 0) continue;
        for (size_t o = 0; o < s.in.size(); ++o) {
          const int vid = s.in[o].front().vid;
          const JitValue& v = p.values[static_cast<size_t>(vid)];
          // One value at every position, and not also another operand (f(w, w): the kernels
          // read it through both slots, and may_write_over sees one).
          const bool one_value =
              std::all_of(s.in[o].begin(), s.in[o].end(),
                          [&](const Ref& r) { return r.vid == vid; }) &&
              std::none_of(s.in.begin(), s.in.end(), [&](const std::vector<Ref>& other) {
                return &other != &s.in[o] &&
                       std::any_of(other.begin(), other.end(),
                                   [&](const Ref& r) { return r.vid == vid; });
              });
          if (!one_value || v.input < 0 || v.keep_to_end ||
              last[static_cast<size_t>(vid)] != static_cast<int>(i) ||
              v.block_bytes != k.temp_bytes[t] || !k.may_write_over(static_cast<int>(o), t)) {
            continue;
          }
          l->reuse.emplace_back(static_cast<uint32_t>(t), static_cast<uint32_t>(o));
        }
      }
    }
    for (auto [m, b] : release[i]) {
      free[static_cast<size_t>(m)].emplace(
          p.planned[static_cast<size_t>(m)][static_cast<size_t>(b)], b);
    }
    // Planned blocks hold no Tensor to drop.
    std::erase_if(s.drop, [&](int v) { return p.values[static_cast<size_t>(v)].planned; });
  }
  for (JitValue& v : p.values) {
    v.first = p.flat;
    p.flat += static_cast<size_t>(v.npos);
  }
  for (JitStep& s : p.steps) {
    const size_t npos = s.in.empty() ? 0 : s.in.front().size();
    s.in_flat.assign(npos * s.in.size(), 0);
    for (size_t i = 0; i < s.in.size(); ++i) {
      for (size_t pos = 0; pos < npos; ++pos) {
        const Ref& r = s.in[i][pos];
        s.in_flat[pos * s.in.size() + i] = static_cast<uint32_t>(
            p.values[static_cast<size_t>(r.vid)].first + static_cast<size_t>(r.pos));
      }
    }
    for (int v : s.out) {
      s.out_first.push_back(static_cast<uint32_t>(p.values[static_cast<size_t>(v)].first));
    }
    if (LocalStep* l = s.local(); l != nullptr && l->kernels != nullptr) {
      for (size_t i = 0; i < s.in.size(); ++i) {
        bool fixed = true;
        for (const Ref& r : s.in[i]) fixed = fixed && p.values[static_cast<size_t>(r.vid)].planned;
        if (!fixed) l->dyn_operands.push_back(static_cast<uint32_t>(i));
      }
    }
  }
  p.places.resize(p.meshes.size());
  for (size_t m = 0; m < p.meshes.size(); ++m) {
    for (const Device& d : p.meshes[m].devices()) {
      p.places[m].push_back(JitPlace{d, is_local(d) ? &backend_of(d) : nullptr, d.local_index()});
    }
  }
}

}  // namespace meshrt::detail
