// The alpha-beta link model: hand-computed step costs, and the property the algorithms issue
// asks for: on a ring, bidirectional ring takes about half the time of ring for large messages.
#include <gtest/gtest.h>

#include "bench/link_model.h"
#include "tests/test_util.h"

namespace meshrt {
namespace {

using Algo = CollectiveAlgo;
using bench::LinkModel;
using Kind = bench::Op;

TEST(LinkModel, StepCostsByHand) {
  LinkModel ring = LinkModel::parse("ring:5us:100GBps");
  // One transfer to the neighbour: alpha + bytes/beta.
  EXPECT_NEAR(ring.step_time(8, {{0, 1, 1e6}}), 5e-6 + 1e6 / 100e9, 1e-12);
  // 0 -> 3 on a ring of 8: 3 hops.
  EXPECT_NEAR(ring.step_time(8, {{0, 3, 1e6}}), 3 * 5e-6 + 1e6 / 100e9, 1e-12);
  // Two transfers sharing link 1->2 (0->2 and 1->2): that link carries both.
  EXPECT_NEAR(ring.step_time(8, {{0, 2, 1e6}, {1, 2, 1e6}}), 2 * 5e-6 + 2e6 / 100e9, 1e-12);
  // Opposite directions use different directed links.
  EXPECT_NEAR(ring.step_time(8, {{0, 1, 1e6}, {1, 0, 1e6}}), 5e-6 + 1e6 / 100e9, 1e-12);
  LinkModel full = LinkModel::parse("full:1us:10GBps");
  EXPECT_NEAR(full.step_time(8, {{0, 5, 1e6}, {3, 5, 1e6}}), 1e-6 + 1e6 / 10e9, 1e-12);
  LinkModel torus = LinkModel::parse("torus2d:1us:1GBps");
  // 4 x 4 torus: 0 -> 5 is one hop along x then one along y.
  EXPECT_NEAR(torus.step_time(16, {{0, 5, 1e3}}), 2e-6 + 1e3 / 1e9, 1e-12);
}

TEST(LinkModel, BidirectionalRingHalvesRingForLargeMessages) {
  for (const char* spec : {"ring:5us:100GBps", "torus2d:2us:50GBps", "full:1us:300GBps"}) {
    LinkModel m = LinkModel::parse(spec);
    const double big = 256.0 * (1 << 20);
    for (int64_t n : {4, 8, 16}) {
      const double ring = m.collective_time(Kind::all_reduce, Algo::ring, n, big);
      const double bidi = m.collective_time(Kind::all_reduce, Algo::bidi_ring, n, big);
      if (std::string(spec).rfind("torus2d", 0) == 0) {
        // A ring in device order is not neighbour-to-neighbour on a torus (e.g. 2x2: 1 -> 2 is
        // diagonal), so the two directions can share links: never slower, not always half.
        EXPECT_LE(bidi, ring * 1.0001) << spec << " n=" << n;
      } else {
        EXPECT_NEAR(bidi / ring, 0.5, 0.02) << spec << " n=" << n;
      }
      // The ring algorithm's closed form: 2(n-1) steps of alpha + (S/n)/beta.
      EXPECT_GT(ring, 0);
    }
    // Small messages: latency-bound, both pay 2(n-1) alphas.
    EXPECT_NEAR(m.collective_time(Kind::all_reduce, Algo::bidi_ring, 8, 8) /
                    m.collective_time(Kind::all_reduce, Algo::ring, 8, 8),
                1.0, 0.01)
        << spec;
  }
  // On a ring topology the one-shot algorithm's all-pairs traffic contends for links.
  LinkModel ring = LinkModel::parse("ring:0us:100GBps");
  EXPECT_GT(ring.collective_time(Kind::all_reduce, Algo::direct, 8, 1e9),
            ring.collective_time(Kind::all_reduce, Algo::ring, 8, 1e9));
  LinkModel full = LinkModel::parse("full:0us:100GBps");
  EXPECT_LT(full.collective_time(Kind::all_reduce, Algo::direct, 8, 1e9),
            full.collective_time(Kind::all_reduce, Algo::ring, 8, 1e9));
}

TEST(LinkModel, BadSpecs) {
  EXPECT_MESHRT_ERROR(LinkModel::parse("ring:5us"), "[link_model]", "topology:latency:bandwidth");
  EXPECT_MESHRT_ERROR(LinkModel::parse("mesh:5us:1GBps"), "topology 'mesh'");
  EXPECT_MESHRT_ERROR(LinkModel::parse("ring:5:1GBps"), "needs a unit");
  EXPECT_MESHRT_ERROR(LinkModel::parse("ring:5us:fast"), "does not start with a number");
}

}  // namespace
}  // namespace meshrt
