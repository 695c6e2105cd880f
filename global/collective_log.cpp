#include "global/collective_log.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/config.h"

namespace meshrt {
namespace {

std::mutex g_mu;
std::vector<CollectiveLog*> g_active;  // guarded by g_mu

std::string line(const CollectiveLog::Entry& e) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-26s %-13s %-7s %-44s %12lld %10.1f", e.op.c_str(),
                e.collective.c_str(), e.algorithm.c_str(), (e.from + " -> " + e.to).c_str(),
                static_cast<long long>(e.bytes_per_device), e.seconds * 1e6);
  std::string s = buf;
  if (!e.note.empty()) s += "  " + e.note;
  return s;
}

const char* kHeader =
    "op                         collective    algo    from -> to                                  "
    "bytes/device    time us";

}  // namespace

CollectiveLog::Recording::Recording(CollectiveLog* log) : log_(log) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_active.push_back(log_);
}
CollectiveLog::Recording::Recording(Recording&& o) noexcept : log_(o.log_) { o.log_ = nullptr; }
CollectiveLog::Recording::~Recording() {
  if (log_ == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = std::find(g_active.begin(), g_active.end(), log_);
  if (it != g_active.end()) g_active.erase(it);
}

CollectiveLog::Recording CollectiveLog::record() { return Recording(this); }

std::vector<CollectiveLog::Entry> CollectiveLog::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}
size_t CollectiveLog::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}
void CollectiveLog::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

std::string CollectiveLog::str() const {
  std::ostringstream os;
  os << kHeader << "\n";
  for (const Entry& e : entries()) os << line(e) << "\n";
  return os.str();
}

void CollectiveLog::add(Entry entry) {
  if (config::log_collectives()) std::fprintf(stderr, "[meshrt] %s\n", line(entry).c_str());
  std::lock_guard<std::mutex> lock(g_mu);
  for (CollectiveLog* log : g_active) {
    std::lock_guard<std::mutex> l2(log->mu_);
    log->entries_.push_back(entry);
  }
}

}  // namespace meshrt
