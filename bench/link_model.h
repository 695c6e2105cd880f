// bench/link_model.h: an alpha-beta model of an interconnect, to report what a collective
// algorithm would cost on a TPU-like ring, a 2-D torus or an all-to-all (NVLink-switch-like) box
// while the cpu platform moves the real data.
//
// Every algorithm is a sequence of synchronous steps; a step is a set of transfers (src, dst,
// bytes). A transfer is routed on shortest paths (ties clockwise / x before y); each directed
// link has bandwidth beta and every hop latency alpha. A step costs
//   max over transfers (alpha * hops) + max over directed links (bytes on the link) / beta,
// and the collective costs the sum of its steps: the time of every transfer, accumulated.
#pragma once

#include <meshrt/meshrt.h>

#include <cstdint>
#include <string>
#include <vector>

namespace meshrt::bench {

// The collectives meshrt-bench measures, named as nccl-tests names them.
enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all, ppermute };

class LinkModel {
 public:
  enum class Topology { ring, torus2d, full };
  // "ring:5us:100GBps", "torus2d:1us:50GBps", "full:2us:300GBps" (units: ns, us, ms; B/s with
  // K/M/G and "Bps" or "GBps"). A malformed spec is an Error.
  static LinkModel parse(const std::string& spec);
  LinkModel(Topology t, double alpha_s, double beta_bytes_per_s)
      : topo_(t), alpha_(alpha_s), beta_(beta_bytes_per_s) {}

  struct Transfer {
    int64_t src, dst;
    double bytes;
  };
  // Seconds for one step of concurrent transfers among n devices.
  double step_time(int64_t n, const std::vector<Transfer>& transfers) const;
  // Seconds for a whole collective: `bytes` per device as meshrt-bench counts it (all_reduce:
  // the buffer; all_gather: the gathered output; reduce_scatter and all_to_all: the input;
  // ppermute: the buffer, a ring shift).
  double collective_time(Op op, CollectiveAlgo algo, int64_t n, double bytes) const;
  std::string str() const;

 private:
  Topology topo_;
  double alpha_, beta_;
};

}  // namespace meshrt::bench
