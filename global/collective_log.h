// meshrt/collective_log.h: every collective the global view inserts, made visible.
//
//   CollectiveLog log;
//   {
//     auto on = log.record();              // entries are collected while `on` lives
//     Array s = with_sharding_constraint(sum(x, 0), NamedSharding(mesh, P("x")));
//   }
//   std::cout << log.str();                // one line per collective: op, collective, from -> to
//
// MESHRT_LOG_COLLECTIVES=1 prints the same lines to stderr as they happen. Recording is
// process-wide (ops run from any thread are logged into every active recording).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace meshrt {

namespace detail {
struct CollectiveLogAccess;  // global/launch.h
}  // namespace detail

// Records the collectives the global view inserts while a Recording is alive (the file comment
// has an example). Thread-safe: entries may be added from any thread.
class CollectiveLog {
 public:
  // One inserted collective.
  struct Entry {
    // The op that caused it: for a pending sum taken later, the op that made the sum ("sum",
    // "matmul", "gradient of args[0].w1 (matmul)"), with `note` saying where it was taken
    // ("summed at a read of the value", "summed at with_sharding_constraint"); else the op
    // that resharded ("add", "with_sharding_constraint").
    std::string op;
    std::string collective;  // "psum", "psum_scatter", "all_gather", "all_to_all"
    std::string algorithm;   // how it moved ("direct", or "copy" for reshards by block copies)
    // The shardings before (`from`) and after (`to`), as text.
    std::string from, to;  // shardings as text ("P('x',) sum over ('x',)" for pending sums)
    // Bytes each device receives (and sends): psum, its block (4 for a float32 scalar: the
    // addend out, the sum back); psum_scatter, all_gather and all_to_all, the (n-1)/n of the
    // block that comes from the other devices.
    int64_t bytes_per_device = 0;
    double seconds = 0;  // wall time the collective took
    std::string note;    // why, where it is not obvious (e.g. a spec that does not divide)
  };

  // While the returned object lives, inserted collectives are appended to this log.
  class Recording {
   public:
    // Moves the recording; the moved-from object records nothing.
    Recording(Recording&&) noexcept;
    Recording& operator=(Recording&&) = delete;
    ~Recording();

   private:
    friend class CollectiveLog;
    explicit Recording(CollectiveLog* log);
    CollectiveLog* log_;
  };
  // Starts recording into this log until the returned Recording is destroyed. Several
  // recordings (of this log or others) may be active at once.
  [[nodiscard]] Recording record();

  // A copy of the entries recorded so far, oldest first.
  std::vector<Entry> entries() const;
  // Number of entries recorded so far.
  size_t size() const;
  // Drops every entry; active recordings keep recording.
  void clear();
  // A table: op, collective, algorithm, from -> to, bytes per device, microseconds.
  std::string str() const;

 private:
  // Appends `entry` to every active recording: the global view calls it for each collective it
  // inserts (detail::CollectiveLogAccess).
  static void add(Entry entry);
  friend struct detail::CollectiveLogAccess;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
};

}  // namespace meshrt
