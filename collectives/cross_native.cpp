// A collective across processes on a device platform: the platform library's communicators
// spanning the group's processes (collectives/cross.h, step 2 on cuda).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/native_comm.h"
#include "backends/process_comm.h"
#include "collectives/collective.h"
#include "collectives/cross.h"
#include "collectives/cross_detail.h"
#include "collectives/pieces.h"
#include "core/error.h"
#include "core/strings.h"

namespace meshrt::coll {

using detail::cat;

namespace cross_detail {

std::string device_report(const Instance& inst, const Plane& pl,
                          const std::vector<int64_t>& local) {
  std::vector<int> devices;
  for (int64_t k : local) devices.push_back(inst.slot(k).device);
  backend::NativeComm* nc = pl.backend()->native_comm();
  const std::string why =
      nc == nullptr ? "the platform has no collective library" : nc->unavailable(devices);
  return cat(detail::join(devices, ",", [](int d) { return cat(d); }), "|", why);
}

void open_spanning(Session& session, Instance& inst, const Plane& pl,
                   const std::vector<int>& proc_of, const std::vector<int>& procs, int key,
                   backend::ProcessComm::Deadline deadline, const std::vector<std::string>& theirs,
                   size_t header, const std::string& mine) {
  const CrossProcess& cp = *session.cross();
  const Call& c = inst.call();
  const std::string op = cat("[", kind_name(c.kind), "] ");
  auto group = std::make_shared<backend::CommGroup>();
  group->processes = proc_of;
  group->devices.assign(proc_of.size(), -1);
  std::string refused;
  for (size_t p = 0; p < procs.size(); ++p) {
    const std::string_view report =
        std::string_view(theirs[p]).substr(std::min(header, theirs[p].size()));
    const size_t bar = std::min(report.find('|'), report.size());
    std::vector<int> devs;
    for (size_t at = 0; at < bar;) {
      const size_t end = std::min(report.find(',', at), bar);
      devs.push_back(std::atoi(std::string(report.substr(at, end - at)).c_str()));
      at = end + 1;
    }
    if (bar + 1 < report.size())
      refused +=
          cat(refused.empty() ? "" : "; ", "process ", procs[p], ": ", report.substr(bar + 1));
    size_t next = 0;
    for (size_t k = 0; k < proc_of.size(); ++k) {
      if (proc_of[k] != procs[p]) continue;
      if (next < devs.size()) group->devices[k] = devs[next];
      ++next;
    }
    if (next != devs.size()) {
      fail(session, inst,
           cat(op, mine, ": process ", procs[p], " reported ", devs.size(), " devices for its ",
               next, " members of this group; every process must run the same meshrt build"),
           false);
    }
  }
  backend::NativeComm& nc = pl.native_comm();
  if (!refused.empty()) {
    fail(session, inst,
         cat(op, mine, ": ", nc.name(), " cannot serve this group across processes (", refused,
             "). Across processes every member is a ", nc.name(),
             " rank of its own GPU: run with MESHRT_CUDA_DEVICES_PER_GPU=1, or use a mesh whose "
             "groups across processes hold at most one logical device per GPU"),
         false);
  }
  if (!nc.spanning_open(*group)) {
    backend::ProcessComm& comm = *cp.comm;
    const int root = proc_of.front();
    const double timeout_s = std::chrono::duration<double>(session.timeout()).count();
    std::string token = "-";  // 'T' + the token, 'E' + why it could not be made, '-': not root
    if (root == cp.rank) {
      try {
        token = "T" + nc.new_token();
      } catch (const Error& e) {
        token = std::string("E") + e.what();
      }
    }
    std::vector<std::string> tokens;
    if (!comm.exchange(procs, key, token, tokens, deadline, mine).empty()) {
      fail(session, inst,
           cat(op, mine, ": the exchange of ", nc.name(), "'s unique id across processes ",
               procs_str(procs), " did not complete within MESHRT_COLLECTIVE_TIMEOUT (", timeout_s,
               " s) after every process had arrived; a process died or the job is overloaded"),
           true);
    }
    const std::string& got = tokens[static_cast<size_t>(
        std::lower_bound(procs.begin(), procs.end(), root) - procs.begin())];
    if (got.empty() || got[0] == '-') {
      fail(session, inst,
           cat(op, mine, ": process ", root, " holds ", nc.name(),
               " communicators for this group and this process does not (an earlier creation "
               "failed on some processes); end the job"),
           true);
    }
    if (got[0] == 'E') {
      fail(session, inst, cat(op, mine, ": process ", root, ": ", got.substr(1)), false);
    }
    try {
      nc.open_spanning(*group, cp.rank, got.substr(1));
    } catch (const Error& e) {
      fail(session, inst, cat(op, mine, ": ", e.what()), true);
    }
  }
  if (c.algo != Algo::native) {  // the call was set up for another algorithm
    Call native = c;
    native.algo = Algo::native;
    if (const int64_t wb = work_bytes(native, inst.size()); wb > 0) {
      try {
        for (int64_t k : local_members(session, inst)) {
          const Slot& s = inst.slot(k);
          std::shared_ptr<backend::Buffer> buf =
              s.backend->allocate(s.device, static_cast<size_t>(wb));
          void* data = buf->data();
          inst.set_work(k, data, std::move(buf));
        }
      } catch (const Error& e) {
        fail(session, inst, cat(op, mine, ": ", e.what()), false);
      }
    }
  }
  inst.cross_stage() = std::move(group);
}

}  // namespace cross_detail

const backend::CommGroup& spanning_group(Instance& inst) {
  return *static_cast<const backend::CommGroup*>(inst.cross_stage().get());
}

}  // namespace meshrt::coll
