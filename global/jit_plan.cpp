// jit's plan: unused steps removed, each value's last use, the launches, psum buckets;
// then the buffer pass (global/jit_buffers.cpp).
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "collectives/groups.h"
#include "core/config.h"
#include "global/jit_ir.h"
#include "global/jit_shard_map.h"
#include "runtime/detail/platform.h"

namespace meshrt::detail {

namespace {

// Whether a psum step may join a bucket: a device platform (each collective there costs a
// stream wait and a host round trip; host memory has host_psum), every device in this process,
// and the direct algorithm, whose sum of each element is the same whatever else is summed with
// it, so a bucket gives the separate psums' bits (a vendor library's may depend on the size).
bool bucketable(const JitStep& s) {
  const BlocksStep* b = s.blocks();
  if (b == nullptr || b->host_psum || b->psum_axes.empty()) return false;
  const std::vector<Device>& devs = s.mesh->devices();
  for (const Device& d : devs) {
    if (!is_local(d)) return false;
  }
  backend::Backend& be = backend_of(devs.front());
  if (be.host_addressable()) return false;
  const std::string algo = config::collective_algo();
  if (algo != "auto" && algo != "direct") return false;
  if (algo == "auto") {  // automatic picks the vendor library where it serves the group
    std::vector<int> positions;
    for (const std::string& a : b->psum_axes) positions.push_back(s.mesh->axis_position(a));
    for (const auto& group : coll::make_group_layout(s.mesh->shape(), positions).members) {
      std::vector<int> locals;
      for (int64_t m : group) locals.push_back(devs[static_cast<size_t>(m)].local_index());
      if (be.native_unavailable(locals).empty()) return false;
    }
  }
  return true;
}

// Consecutive psum steps of one launch over the same axes and dtype, none reading another's
// result, become one bucket (at most kBucketBytes per device): one collective instead of one each
// (the gradients of a data-parallel step, resolved one leaf after another).
void plan_psum_buckets(JitProgram& p) {
  constexpr int64_t kBucketBytes = int64_t{256} << 20;
  for (const JitLaunch& launch : p.launches) {
    if (launch.kind != JitLaunch::Kind::tasks) continue;
    for (size_t i = launch.begin; i < launch.end;) {
      const JitStep& s = p.steps[i];
      if (!bucketable(s)) {
        ++i;
        continue;
      }
      const BlocksStep& sb = *s.blocks();
      std::set<int> made(s.out.begin(), s.out.end());
      int64_t bytes = shape_size(sb.block_shape) * static_cast<int64_t>(dtype_size(sb.dtype));
      size_t j = i + 1;
      for (; j < launch.end; ++j) {
        const JitStep& t = p.steps[j];
        if (!bucketable(t)) break;
        const BlocksStep& tb = *t.blocks();
        if (tb.psum_axes != sb.psum_axes || tb.dtype != sb.dtype) break;
        const int64_t b = shape_size(tb.block_shape) * static_cast<int64_t>(dtype_size(tb.dtype));
        if (bytes + b > kBucketBytes) break;
        bool reads_bucket = false;
        for (const Ref& r : t.in.front()) reads_bucket = reads_bucket || made.count(r.vid) != 0;
        if (reads_bucket) break;
        made.insert(t.out.begin(), t.out.end());
        bytes += b;
      }
      if (j - i >= 2) p.steps[i].blocks()->bucket_end = j;
      i = j;
    }
  }
}
}  // namespace

void jit_plan(JitProgram& p) {
  std::vector<bool> live(p.values.size(), false);
  for (const JitOutput& o : p.outputs) {
    for (const Ref& r : o.refs) {
      live[static_cast<size_t>(r.vid)] = true;
      p.values[static_cast<size_t>(r.vid)].keep_to_end = true;
    }
  }
  std::vector<JitStep> kept;
  for (size_t i = p.steps.size(); i-- > 0;) {
    JitStep& s = p.steps[i];
    const bool used = std::any_of(s.out.begin(), s.out.end(),
                                  [&](int v) { return live[static_cast<size_t>(v)]; });
    if (!used) continue;
    for (auto& refs : s.in) {
      for (const Ref& r : refs) live[static_cast<size_t>(r.vid)] = true;
    }
    kept.push_back(std::move(s));
  }
  std::reverse(kept.begin(), kept.end());
  p.steps = std::move(kept);
  // Lines whose results only dropped steps made are printed as not replayed.
  std::vector<bool> made(p.values.size(), false);
  for (const JitStep& s : p.steps) {
    for (int v : s.out) made[static_cast<size_t>(v)] = true;
  }
  for (JitLine& l : p.lines) {
    if (l.out_vids.empty()) continue;
    l.replayed = std::any_of(l.out_vids.begin(), l.out_vids.end(), [&](int v) {
      const JitValue& jv = p.values[static_cast<size_t>(v)];
      return made[static_cast<size_t>(v)] || jv.input >= 0 || jv.constant;
    });
  }

  jit_fuse_steps(p);
  for (JitStep& s : p.steps) {
    if (ShardMapStep* sm = s.shard_map()) {
      for (BodyProgram& b : sm->bodies) plan_body_frees(b);
    }
  }

  // Last reader of each value (at the reader's own position); values read across positions or by
  // reshards (which read every position from the caller) stay until the call ends.
  std::vector<int> last(p.values.size(), -1);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const JitStep& s = p.steps[i];
    for (auto& refs : s.in) {
      for (size_t pos = 0; pos < refs.size(); ++pos) {
        JitValue& v = p.values[static_cast<size_t>(refs[pos].vid)];
        if (s.reshard() != nullptr || refs[pos].pos != static_cast<int>(pos)) {
          v.keep_to_end = true;
        }
        last[static_cast<size_t>(refs[pos].vid)] = static_cast<int>(i);
      }
    }
  }
  for (size_t v = 0; v < p.values.size(); ++v) {
    if (last[v] >= 0 && !p.values[v].keep_to_end && !p.values[v].constant) {
      p.steps[static_cast<size_t>(last[v])].drop.push_back(static_cast<int>(v));
    }
  }

  // Launches: consecutive steps on one mesh, split where a step reads another position's block
  // made in the same launch; a reshard or a shard_map step is a launch of its own.
  using Kind = JitLaunch::Kind;
  std::vector<int> made_in(p.values.size(), -1);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const JitStep& s = p.steps[i];
    bool join = false;
    if (s.reshard() == nullptr && s.shard_map() == nullptr && !p.launches.empty()) {
      const JitLaunch& cur = p.launches.back();
      join = cur.kind != Kind::reshard && cur.kind != Kind::shard_map &&
             *p.steps[cur.begin].mesh == *s.mesh;
      for (auto& refs : s.in) {
        for (size_t pos = 0; join && pos < refs.size(); ++pos) {
          const Ref& r = refs[pos];
          if (r.pos != static_cast<int>(pos) &&
              made_in[static_cast<size_t>(r.vid)] == static_cast<int>(p.launches.size()) - 1) {
            join = false;
          }
        }
      }
    }
    if (join) {
      p.launches.back().end = i + 1;
    } else {
      const Kind kind = s.reshard() != nullptr     ? Kind::reshard
                        : s.shard_map() != nullptr ? Kind::shard_map
                                                   : Kind::tasks;
      p.launches.push_back(JitLaunch{i, i + 1, kind});
    }
    for (int v : s.out) made_in[static_cast<size_t>(v)] = static_cast<int>(p.launches.size()) - 1;
  }
  // A launch with a collective (or with large blocks, which eager ops compute on every device's
  // executor at once) runs as one task per device, all of its steps inside, so the executors are
  // woken once per launch. A launch of small device-local steps runs from the caller's thread,
  // device after device (as eager ops do, minus their planning): waking executors would cost
  // more than the work.
  // A psum the replay folds itself reads every position's block: a launch of its own, between the
  // steps before it (for every position) and after it.
  std::vector<JitLaunch> split;
  for (const JitLaunch& launch : p.launches) {
    size_t from = launch.begin;
    for (size_t i = launch.begin; i < launch.end; ++i) {
      if (!p.steps[i].host_psum()) continue;
      if (from < i) split.push_back(JitLaunch{from, i, launch.kind});
      split.push_back(JitLaunch{i, i + 1, Kind::fold});
      from = i + 1;
    }
    if (from < launch.end) split.push_back(JitLaunch{from, launch.end, launch.kind});
  }
  p.launches = std::move(split);
  for (JitLaunch& launch : p.launches) {
    if (launch.kind != Kind::tasks) continue;
    bool small = true;
    for (size_t i = launch.begin; i < launch.end; ++i) {
      const LocalStep* l = p.steps[i].local();
      if (l == nullptr || l->concurrent) small = false;
    }
    if (small) launch.kind = Kind::inline_run;
  }
  plan_psum_buckets(p);
  jit_plan_buffers(p, last);
}

}  // namespace meshrt::detail
