// jit's printed forms: the program as text (as_text) and as a Graphviz digraph (as_dot).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/strings.h"
#include "global/jit_ir.h"
#include "global/jit_program.h"

namespace meshrt::detail {

namespace {

std::string line_ref(const JitProgram& p, int from) {
  if (from == kConst) return "const";
  if (from < 0) return p.in_paths[static_cast<size_t>(-1 - from)];
  return cat("%", from);
}

}  // namespace

std::string jit_text(const JitProgram& p, const std::vector<bool>& donated) {
  std::string s = cat("jit(", p.name, ")\n");
  for (size_t i = 0; i < p.in_paths.size(); ++i) {
    s += cat("  in  ", p.in_paths[i], ": ", p.in_avals[i], "\n");
  }
  for (size_t k = 0; k < p.lines.size(); ++k) {
    const JitLine& l = p.lines[k];
    s += cat("  %", k, " = ", l.op, "(");
    for (size_t i = 0; i < l.ins.size(); ++i) {
      s += cat(i ? ", " : "", line_ref(p, l.in_from[i]), ": ", l.ins[i]);
    }
    s += ") -> ";
    for (size_t i = 0; i < l.outs.size(); ++i) s += cat(i ? ", " : "", l.outs[i]);
    s += l.replayed ? "\n" : "  (unused: not replayed)\n";
    for (const std::string& note : l.notes) s += cat("      ", note, "\n");
    for (const CollectiveLog::Entry& e : l.collectives) {
      s += cat("      ", e.collective, " ", e.from, " -> ", e.to, ", ", e.bytes_per_device,
               " bytes per device", e.note.empty() ? "" : " (" + e.note + ")", "\n");
    }
  }
  for (size_t i = 0; i < p.out_paths.size(); ++i) {
    s += cat("  out ", p.out_paths[i], " = ", line_ref(p, p.output_from[i]), ": ", p.out_avals[i],
             "\n");
  }
  size_t host = 0, device = 0, inline_runs = 0, folds = 0, collectives = 0, shard_maps = 0;
  for (const JitLaunch& launch : p.launches) {
    switch (launch.kind) {
      case JitLaunch::Kind::tasks:
        ++device;
        break;
      case JitLaunch::Kind::inline_run:
        ++inline_runs;
        break;
      case JitLaunch::Kind::fold:
        ++folds;
        break;
      case JitLaunch::Kind::reshard:
        ++host;
        break;
      case JitLaunch::Kind::shard_map:
        ++shard_maps;
        break;
    }
  }
  size_t compiled = 0, kernels = 0, fused = 0, epilogues = 0, drelus = 0, chains = 0, chained = 0,
         chain_outputs = 0, chain_constants = 0, buffers = 0, buffer_bytes = 0;
  std::map<std::string, size_t> why_not;  // of device-local steps not compiled
  for (const JitStep& st : p.steps) {
    collectives += st.blocks() != nullptr ? 1 : 0;
    if (const ShardMapStep* sm = st.shard_map()) {
      bool any = false;
      for (const BodyProgram& b : sm->bodies) {
        for (const BodyOp& op : b.ops) any = any || op_def(op.op).collective;
      }
      collectives += any ? 1 : 0;
    }
    if (const KernelProgram* k = st.kernels()) {
      ++compiled;
      kernels += k->size();
      for (const detail::KernelCall& c : k->calls) {
        using K = detail::KernelCall::Kind;
        fused += c.kind == K::binary_unary || c.kind == K::compare_select ? 1 : 0;
        epilogues += c.kind == K::matmul_bias ? 1 : 0;
        drelus += c.kind == K::matmul_drelu ? 1 : 0;
        if (c.kind == K::chain) {
          ++chains;
          for (const backend::ChainOp& o : c.chain->ops) {
            const bool constant = o.kind == backend::ChainOp::Kind::constant;
            chained += constant ? 0 : 1;
            chain_constants += constant ? 1 : 0;
          }
          chain_outputs += c.chain->output_count();
        }
      }
    } else if (const LocalStep* l = st.local()) {
      ++why_not[l->why_not.empty() ? "not recorded" : l->why_not];
    }
  }
  for (const std::vector<size_t>& m : p.planned) {
    buffers += m.size();
    for (size_t b : m) buffer_bytes += b;
  }
  s += cat("  replay: ", p.steps.size(), " steps (", collectives, " with collectives) in ",
           p.launches.size(), " launches per call: ", device, " as one task per device, ",
           inline_runs, " on small blocks from the caller's thread, ", folds,
           " small psums folded from the caller's thread, ", host, " reshards from the caller",
           shard_maps == 0 ? "" : cat(", ", shard_maps, " shard_maps (their recorded bodies)"),
           "\n");
  size_t buckets = 0, bucketed = 0;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const BlocksStep* b = p.steps[i].blocks();
    if (b != nullptr && b->bucket_end > i) {
      ++buckets;
      bucketed += b->bucket_end - i;
    }
  }
  if (buckets != 0) {
    s += cat("  psum buckets: ", bucketed, " psums taken as ", buckets,
             " collective(s) over their blocks laid end to end\n");
  }
  s += cat("  compiled: ", compiled, " device-local steps as ", kernels,
           " kernel calls; intermediates in ", buffers, " planned buffers per device (",
           buffer_bytes, " bytes), reused by every call\n");
  size_t segments = 0, segment_ops = 0, segment_calls = 0, body_ops = 0;
  for (const JitStep& st : p.steps) {
    const ShardMapStep* sm = st.shard_map();
    if (sm == nullptr) continue;
    for (const BodyProgram& b : sm->bodies) {
      if (!b.ops.empty() || !b.results.empty()) {
        body_ops += b.ops.size();
        break;
      }
    }
    for (const BodySegment& seg : sm->segments) {
      ++segments;
      segment_ops += seg.end - seg.begin;
      segment_calls += seg.kernels->size();
    }
  }
  if (body_ops != 0) {
    s += cat("  shard_map bodies: ", segment_ops, " of their ", body_ops, " ops per device in ",
             segments, " compiled runs (", segment_calls,
             " kernel calls), the others and the collectives one by one\n");
  }
  if (fused != 0) {
    s += cat("  fused: ", fused,
             " kernel calls are fused elementwise pairs (bias add + relu, comparison + select), "
             "with the pairs' bits\n");
  }
  if (chains != 0) {
    s += cat("  fused: ", chains, " elementwise chains of ", chained, " kernels in all, writing ",
             chain_outputs, " values, ", chain_constants,
             " scalars held as constants; each one call whose other intermediates stay out of "
             "memory, with the kernels' bits\n");
  }
  if (epilogues != 0) {
    s += cat("  fused: ", epilogues,
             " products carry their layer's bias add (and relu) as one call (matmul_bias)\n");
  }
  if (drelus != 0) {
    s += cat("  fused: ", drelus,
             " products carry relu's gradient after them as one call (matmul_drelu)\n");
  }
  // Only what a call with these donations can do: a step counts when one of the operands whose
  // buffer it may take is a donated input.
  size_t in_place = 0;
  for (const JitStep& st : p.steps) {
    const LocalStep* l = st.local();
    if (l == nullptr) continue;
    in_place += std::any_of(l->reuse.begin(), l->reuse.end(), [&](const auto& r) {
      const int input = p.values[static_cast<size_t>(st.in[r.second].front().vid)].input;
      return input >= 0 && static_cast<size_t>(input) < donated.size() &&
             donated[static_cast<size_t>(input)];
    });
  }
  if (in_place != 0) {
    s += cat("  in place: ", in_place,
             in_place == 1 ? " compiled step writes" : " compiled steps write",
             " results into the buffers of donated inputs read there last\n");
  }
  for (const auto& [why, n] : why_not) {
    s += cat("  not compiled: ", n, n == 1 ? " step" : " steps", " (", why, ")\n");
  }
  return s;
}

namespace {
std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
}  // namespace

std::string jit_dot(const JitProgram& p) {
  std::string s = cat("digraph \"jit(", esc(p.name), ")\" {\n  rankdir=TB;\n",
                      "  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  auto node_of = [&](int from) {
    if (from == kConst) return std::string("const");
    if (from < 0) return cat("in", -1 - from);
    return cat("op", from);
  };
  bool has_const = false;
  for (size_t i = 0; i < p.in_paths.size(); ++i) {
    s += cat("  in", i, " [shape=ellipse, label=\"", esc(p.in_paths[i]), "\\n", esc(p.in_avals[i]),
             "\"];\n");
  }
  for (size_t k = 0; k < p.lines.size(); ++k) {
    const JitLine& l = p.lines[k];
    std::string outs;
    for (size_t i = 0; i < l.outs.size(); ++i) outs += (i ? "\\n" : "") + esc(l.outs[i]);
    std::string notes;  // a shard_map's body: its op count and collectives
    for (const std::string& n : l.notes) notes += "\\n" + esc(n);
    s += cat("  op", k, " [label=\"%", k, " ", esc(l.op), "\\n", outs, notes, "\"];\n");
    for (size_t c = 0; c < l.collectives.size(); ++c) {
      const CollectiveLog::Entry& e = l.collectives[c];
      s += cat("  op", k, "_c", c,
               " [shape=octagon, style=filled, fillcolor=\"#ff9999\", color=red, label=\"",
               esc(e.collective), "\\n", e.bytes_per_device, " B/device\\n", esc(e.from), " -> ",
               esc(e.to), "\"];\n");
      s += cat("  op", k, "_c", c, " -> op", k, " [color=red];\n");
    }
    for (size_t i = 0; i < l.in_from.size(); ++i) {
      has_const = has_const || l.in_from[i] == kConst;
      const std::string target = l.collectives.empty() ? cat("op", k) : cat("op", k, "_c0");
      s += cat("  ", node_of(l.in_from[i]), " -> ", target, ";\n");
    }
  }
  for (size_t i = 0; i < p.out_paths.size(); ++i) {
    has_const = has_const || p.output_from[i] == kConst;
    s += cat("  out", i, " [shape=ellipse, label=\"", esc(p.out_paths[i]), "\\n",
             esc(p.out_avals[i]), "\"];\n");
    s += cat("  ", node_of(p.output_from[i]), " -> out", i, ";\n");
  }
  if (has_const) s += "  const [shape=plaintext, label=\"constant\"];\n";
  return s + "}\n";
}

}  // namespace meshrt::detail
