// The same programs over several processes (CTest runs this under mpirun as 1x8, 2x4, 4x2 and
// 8x1: processes x cpu devices each). Every result is compared with host arithmetic, exactly
// (integer-valued data): the bits a single-process run gives. Every process runs every test in
// the same order (the SPMD contract).
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

namespace meshrt {
namespace {

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : dflt;
}

std::vector<float> iota(int64_t n, float start = 0.f) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// The global value, on every process.
template <class T>
std::vector<T> gathered(const Array& x) {
  Tensor t = process_allgather(x);
  return t.to_vector<T>();
}

TEST(Multiprocess, ProcessesAndDevicesInGlobalOrder) {
  const int procs = env_int("OMPI_COMM_WORLD_SIZE", 1);
  ASSERT_EQ(process_count(), procs);
  EXPECT_EQ(process_index(), env_int("OMPI_COMM_WORLD_RANK", 0));
  EXPECT_EQ(distributed::is_initialized(), procs > 1);
  const auto& all = devices("cpu");
  const auto& local = local_devices("cpu");
  ASSERT_EQ(all.size(), 8u);
  ASSERT_EQ(local.size() * static_cast<size_t>(procs), 8u);
  const int per = static_cast<int>(local.size());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(all[static_cast<size_t>(i)].process_index(), i / per);
    EXPECT_EQ(all[static_cast<size_t>(i)].local_index(), i % per);
  }
  for (const Device& d : local) EXPECT_EQ(d.process_index(), process_index());
  if (procs > 1) EXPECT_EQ(all[static_cast<size_t>(per)].str(), "p1:cpu:0");
}

TEST(Multiprocess, DevicePutHoldsLocalShardsOnly) {
  Mesh mesh = make_mesh({8}, {"x"});
  std::vector<float> v = iota(16);
  Array x = device_put(v, {16}, NamedSharding(mesh, P("x")));
  std::vector<Shard> shards = x.addressable_shards();
  ASSERT_EQ(shards.size(), local_devices("cpu").size());
  for (const Shard& s : shards) {
    EXPECT_EQ(s.device.process_index(), process_index());
    const int64_t lo = s.index[0].first;
    EXPECT_EQ(s.data.to_vector<float>(),
              (std::vector<float>{static_cast<float>(lo), static_cast<float>(lo + 1)}));
  }
  EXPECT_EQ(gathered<float>(x), v);
  if (process_count() > 1) {
    try {
      x.to_vector<float>();
      ADD_FAILURE() << "to_vector of a non-addressable Array did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("process_allgather"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(x.to_vector<float>(), v);
  }
  // Replicated: every process holds the whole value and may read it.
  Array r = device_put(v, {16}, NamedSharding(mesh, P()));
  EXPECT_EQ(r.to_vector<float>(), v);
}

TEST(Multiprocess, ReshardAcrossProcesses) {
  Mesh mesh = make_mesh({4, 2}, {"a", "b"});
  std::vector<float> v = iota(8 * 8);
  Array x = device_put(v, {8, 8}, NamedSharding(mesh, P("a", "b")));
  for (const PartitionSpec& to : {P("b", "a"), P(), P(None, "b"), P(Axes{"a", "b"})}) {
    Array y = device_put(x, NamedSharding(mesh, to));
    EXPECT_EQ(gathered<float>(y), v) << to.str();
    for (const Shard& s : y.addressable_shards()) {
      std::vector<float> want;
      for (int64_t i = s.index[0].first; i < s.index[0].second; ++i)
        for (int64_t j = s.index[1].first; j < s.index[1].second; ++j)
          want.push_back(v[static_cast<size_t>(i * 8 + j)]);
      EXPECT_EQ(s.data.to_vector<float>(), want) << to.str() << " on " << s.device.str();
    }
  }
}

// Each collective over a 1-D mesh of all 8 devices and over a (4, 2) mesh whose groups are
// partly within a process, against host arithmetic.
TEST(Multiprocess, ReductionsMatchHost) {
  for (bool deterministic : {false, true}) {
    Mesh mesh = make_mesh({8}, {"x"});
    std::vector<float> v = iota(8 * 4, -7.f);
    Array x = device_put(v, {8 * 4}, NamedSharding(mesh, P("x")));
    CollectiveOptions o;
    o.deterministic = deterministic;
    auto run = [&](auto op) { return gathered<float>(shard_map(op, mesh, {P("x")}, P())(x)); };
    std::vector<float> sum(4, 0.f), mx(4, -1e9f), mn(4, 1e9f);
    for (int d = 0; d < 8; ++d) {
      for (int i = 0; i < 4; ++i) {
        const float e = v[static_cast<size_t>(d * 4 + i)];
        sum[static_cast<size_t>(i)] += e;
        mx[static_cast<size_t>(i)] = std::max(mx[static_cast<size_t>(i)], e);
        mn[static_cast<size_t>(i)] = std::min(mn[static_cast<size_t>(i)], e);
      }
    }
    std::vector<float> mean = sum;
    for (float& m : mean) m /= 8.f;
    EXPECT_EQ(run([&](Context& c, const Tensor& t) { return c.psum(t, "x", o); }), sum);
    EXPECT_EQ(run([&](Context& c, const Tensor& t) { return c.pmean(t, "x", o); }), mean);
    EXPECT_EQ(run([&](Context& c, const Tensor& t) { return c.pmax(t, "x", o); }), mx);
    EXPECT_EQ(run([&](Context& c, const Tensor& t) { return c.pmin(t, "x", o); }), mn);
  }
  // Large enough for the big-message paths; int32 exact.
  Mesh mesh = make_mesh({8}, {"x"});
  const int64_t n = 1 << 14;
  std::vector<int32_t> v(static_cast<size_t>(8 * n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i % 1000) - 500;
  Array x = device_put(v, {8 * n}, NamedSharding(mesh, P("x")));
  Array s =
      shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")}, P())(x);
  std::vector<int32_t> want(static_cast<size_t>(n), 0);
  for (int d = 0; d < 8; ++d)
    for (int64_t i = 0; i < n; ++i)
      want[static_cast<size_t>(i)] += v[static_cast<size_t>(d * n + i)];
  EXPECT_EQ(gathered<int32_t>(s), want);
  Array m = shard_map([](Context& c, const Tensor& t) { return c.pmean(t, "x"); }, mesh, {P("x")},
                      P())(x);
  std::vector<float> want_mean(want.begin(), want.end());
  for (float& e : want_mean) e /= 8.f;
  EXPECT_EQ(gathered<float>(m), want_mean);
}

// Large reductions (several of the exchange's 1 MiB pieces, and an odd length) over all 8
// devices, and over groups whose processes hold unequal numbers of members: the devices in the
// order 0 1 2 4 | 3 5 6 7 make each row of a (2, 4) mesh span processes unevenly (2x4: 3 + 1
// and 1 + 3 members; 4x2: 2 + 1 + 1; 8x1: 1 each).
TEST(Multiprocess, LargeReductionsOverEvenAndUnevenGroups) {
  const std::vector<Device>& all = devices("cpu");
  std::vector<Device> order;
  for (int i : {0, 1, 2, 4, 3, 5, 6, 7}) order.push_back(all.at(static_cast<size_t>(i)));
  const int64_t n = (int64_t{1} << 19) + 3;  // int32 per device: 2 MiB and 12 B
  for (const Mesh& mesh : {make_mesh({8}, {"x"}), Mesh(order, {2, 4}, {"a", "x"})}) {
    const int64_t rows = mesh.shape().size() == 1 ? 1 : 2, per = 8 / rows;
    std::vector<int32_t> v(static_cast<size_t>(8 * n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 7) % 1999) - 999;
    const Shape shape = rows == 1 ? Shape{8 * n} : Shape{2, 4 * n};
    const PartitionSpec in = rows == 1 ? P("x") : P("a", "x");
    const PartitionSpec out = rows == 1 ? P() : P("a");
    Array x = device_put(v, shape, NamedSharding(mesh, in));
    // Row r of the result: the fold over the row's `per` blocks of n.
    const auto want_of = [&](auto init, auto f) {
      std::vector<decltype(init)> w(static_cast<size_t>(rows * n), init);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < per; ++d)
          for (int64_t i = 0; i < n; ++i) {
            auto& e = w[static_cast<size_t>(r * n + i)];
            e = f(e, v[static_cast<size_t>((r * per + d) * n + i)]);
          }
      return w;
    };
    const auto run = [&](auto op) { return shard_map(op, mesh, {in}, out)(x); };
    const std::string where = mesh.str();
    EXPECT_EQ(gathered<int32_t>(run([](Context& c, const Tensor& t) { return c.psum(t, "x"); })),
              want_of(int32_t{0}, [](int32_t a, int32_t b) { return a + b; }))
        << where;
    EXPECT_EQ(gathered<int32_t>(run([](Context& c, const Tensor& t) { return c.pmax(t, "x"); })),
              want_of(INT32_MIN, [](int32_t a, int32_t b) { return std::max(a, b); }))
        << where;
    EXPECT_EQ(gathered<int32_t>(run([](Context& c, const Tensor& t) { return c.pmin(t, "x"); })),
              want_of(INT32_MAX, [](int32_t a, int32_t b) { return std::min(a, b); }))
        << where;
    std::vector<int32_t> sum = want_of(int32_t{0}, [](int32_t a, int32_t b) { return a + b; });
    std::vector<float> mean(sum.begin(), sum.end());
    for (float& m : mean) m /= static_cast<float>(per);
    EXPECT_EQ(gathered<float>(run([](Context& c, const Tensor& t) { return c.pmean(t, "x"); })),
              mean)
        << where;
  }
}

TEST(Multiprocess, ReductionsOverPartOfA2DMesh) {
  Mesh mesh = make_mesh({4, 2}, {"a", "b"});
  std::vector<float> v = iota(4 * 2 * 3);
  Array x = device_put(v, {4, 6}, NamedSharding(mesh, P("a", "b")));
  // psum over 'a' (spans processes unless 8x1... always 4 devices), over 'b', over both.
  for (std::vector<std::string> axes :
       {std::vector<std::string>{"a"}, {"b"}, {"a", "b"}, {"b", "a"}}) {
    Array s = shard_map([&](Context& c, const Tensor& t) { return c.psum(t, AxisNames(axes)); },
                        mesh, {P("a", "b")}, P("a", "b"))(x);
    std::vector<float> got = gathered<float>(s);
    std::vector<float> want(24, 0.f);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 2; ++j) {
        for (int e = 0; e < 3; ++e) {
          float acc = 0;
          for (int i2 = 0; i2 < 4; ++i2) {
            for (int j2 = 0; j2 < 2; ++j2) {
              const bool in_a = std::find(axes.begin(), axes.end(), "a") != axes.end();
              const bool in_b = std::find(axes.begin(), axes.end(), "b") != axes.end();
              if ((in_a || i2 == i) && (in_b || j2 == j))
                acc += v[static_cast<size_t>(i2 * 6 + j2 * 3 + e)];
            }
          }
          want[static_cast<size_t>(i * 6 + j * 3 + e)] = acc;
        }
      }
    }
    EXPECT_EQ(got, want) << axes.size() << " axes, first " << axes[0];
  }
}

TEST(Multiprocess, DataMovementMatchesHost) {
  Mesh mesh = make_mesh({8}, {"x"});
  std::vector<float> v = iota(8 * 8);
  Array x = device_put(v, {8, 8}, NamedSharding(mesh, P("x")));  // one row per device
  // all_gather tiled: every device holds the whole array.
  Array g = shard_map([](Context& c, const Tensor& t) { return c.all_gather(t, "x", 0, true); },
                      mesh, {P("x")}, P())(x);
  EXPECT_EQ(gathered<float>(g), v);
  // all_gather stacked along axis 1 of the [1, 8] block: [1, 8, 8], device d's row at [0, d].
  Array g1 = shard_map([](Context& c, const Tensor& t) { return c.all_gather(t, "x", 1); }, mesh,
                       {P("x")}, P())(x);
  EXPECT_EQ(gathered<float>(g1), v);
  // psum_scatter: block [1, 8] -> device d keeps column d of the sum over rows.
  Array rs = shard_map([](Context& c, const Tensor& t) { return c.psum_scatter(t, "x", 1, true); },
                       mesh, {P("x")}, P(None, "x"))(x);
  std::vector<float> colsum(8, 0.f);
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 8; ++col)
      colsum[static_cast<size_t>(col)] += v[static_cast<size_t>(r * 8 + col)];
  EXPECT_EQ(gathered<float>(rs), colsum);
  // psum_scatter along columns of an [8, 8] block (8 rows before the scatter dimension: in one
  // process the host folds whole rows for every member; across processes it must not).
  std::vector<float> v8 = iota(8 * 8 * 8);
  Array x8 = device_put(v8, {64, 8}, NamedSharding(mesh, P("x")));
  Array rs8 = shard_map([](Context& c, const Tensor& t) { return c.psum_scatter(t, "x", 1, true); },
                        mesh, {P("x")}, P(None, "x"))(x8);
  std::vector<float> sum8(64, 0.f);
  for (int d = 0; d < 8; ++d)
    for (int r = 0; r < 8; ++r)
      for (int col = 0; col < 8; ++col)
        sum8[static_cast<size_t>(r * 8 + col)] += v8[static_cast<size_t>((d * 8 + r) * 8 + col)];
  EXPECT_EQ(gathered<float>(rs8), sum8);
  // ppermute: a shift by 3, and a partial permutation (others get zeros).
  Array sh = shard_map(
      [](Context& c, const Tensor& t) {
        std::vector<std::pair<int64_t, int64_t>> perm;
        for (int64_t i = 0; i < 8; ++i) perm.push_back({i, (i + 3) % 8});
        return c.ppermute(t, "x", perm);
      },
      mesh, {P("x")}, P("x"))(x);
  std::vector<float> want(64);
  for (int d = 0; d < 8; ++d)
    for (int e = 0; e < 8; ++e)
      want[static_cast<size_t>(((d + 3) % 8) * 8 + e)] = v[static_cast<size_t>(d * 8 + e)];
  EXPECT_EQ(gathered<float>(sh), want);
  Array part = shard_map(
      [](Context& c, const Tensor& t) {
        return c.ppermute(t, "x", {{0, 7}, {5, 1}});
      },
      mesh, {P("x")}, P("x"))(x);
  std::vector<float> pw(64, 0.f);
  for (int e = 0; e < 8; ++e) {
    pw[static_cast<size_t>(7 * 8 + e)] = v[static_cast<size_t>(e)];
    pw[static_cast<size_t>(1 * 8 + e)] = v[static_cast<size_t>(5 * 8 + e)];
  }
  EXPECT_EQ(gathered<float>(part), pw);
  // all_to_all: the [1, 8] block split along axis 1, concatenated along axis 0: a transpose.
  Array t = shard_map([](Context& c, const Tensor& b) { return c.all_to_all(b, "x", 1, 0, true); },
                      mesh, {P("x")}, P(None, "x"))(x);
  EXPECT_EQ(gathered<float>(t), v);
  Array tt = shard_map([](Context& c, const Tensor& b) { return c.all_to_all(b, "x", 1, 0, true); },
                       mesh, {P("x")}, P("x"))(x);
  std::vector<float> tr(64);
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 8; ++col)
      tr[static_cast<size_t>(col * 8 + r)] = v[static_cast<size_t>(r * 8 + col)];
  EXPECT_EQ(gathered<float>(tt), tr);
}

TEST(Multiprocess, MakeArrayFromCallbackAndLocalData) {
  Mesh mesh = make_mesh({4, 2}, {"a", "b"});
  NamedSharding sh(mesh, P("a"));  // rows split over 'a', replicated over 'b'
  std::vector<float> v = iota(8 * 3);
  Array x = make_array_from_callback({8, 3}, sh, [&](const Index& idx) {
    std::vector<float> part;
    for (int64_t i = idx[0].first; i < idx[0].second; ++i)
      for (int64_t j = idx[1].first; j < idx[1].second; ++j)
        part.push_back(v[static_cast<size_t>(i * 3 + j)]);
    return tensor(part, {idx[0].second - idx[0].first, idx[1].second - idx[1].first},
                  local_devices("cpu")[0]);
  });
  EXPECT_EQ(gathered<float>(x), v);
  // Local data: this process's rows, in order (or the whole value with one process).
  std::vector<int64_t> rows;
  for (const Shard& s : x.addressable_shards())
    for (int64_t i = s.index[0].first; i < s.index[0].second; ++i) rows.push_back(i);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<float> mine;
  for (int64_t i : rows)
    for (int j = 0; j < 3; ++j) mine.push_back(v[static_cast<size_t>(i * 3 + j)]);
  Tensor local = tensor(mine, {static_cast<int64_t>(rows.size()), 3}, local_devices("cpu")[0]);
  Array y = make_array_from_process_local_data(sh, local, {8, 3});
  EXPECT_EQ(gathered<float>(y), v);
}

// The global view over Arrays spanning processes: elementwise ops, a sum over a sharded
// dimension (a pending sum read through psum) and a matmul, against host arithmetic.
TEST(Multiprocess, GlobalViewOps) {
  Mesh mesh = make_mesh({4, 2}, {"a", "b"});
  std::vector<float> v = iota(8 * 4, -5.f);
  Array x = device_put(v, {8, 4}, NamedSharding(mesh, P("a", "b")));
  Array y = x * x + x;
  std::vector<float> want(v.size());
  for (size_t i = 0; i < v.size(); ++i) want[i] = v[i] * v[i] + v[i];
  EXPECT_EQ(gathered<float>(y), want);
  Array s = sum(x, 0);
  std::vector<float> cols(4, 0.f);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 4; ++c) cols[static_cast<size_t>(c)] += v[static_cast<size_t>(r * 4 + c)];
  EXPECT_EQ(gathered<float>(s), cols);
  Array w = device_put(iota(4 * 2), {4, 2}, NamedSharding(mesh, P("b")));
  Array m = matmul(x, w);
  std::vector<float> mm(16, 0.f);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 2; ++c)
      for (int k = 0; k < 4; ++k)
        mm[static_cast<size_t>(r * 2 + c)] +=
            v[static_cast<size_t>(r * 4 + k)] * static_cast<float>(k * 2 + c);
  EXPECT_EQ(gathered<float>(m), mm);
}

// shard_map inside jit (docs/jit.md): each process records its own devices' bodies at trace time
// and replays them; the gradient's transpose body reads the forward body's blocks (x's and w's),
// which jit passes between the two steps on every process.
TEST(Multiprocess, JitOfShardMapAndItsGradient) {
  Mesh mesh = make_mesh({8}, {"x"});
  NamedSharding rows(mesh, P("x")), rep(mesh, P());
  auto f = [&](const Array& x) {
    auto body = [](Context& c, const Tensor& t) { return c.psum(t * t, "x") + t; };
    return shard_map(body, mesh, {P("x")}, P("x"))(x);
  };
  auto step = jit(f);
  auto loss = [&](const Array& w, const Array& x) {
    auto body = [](Context& c, const Tensor& wb, const Tensor& xb) {
      return c.psum(sum(xb * (wb * wb)), "x");
    };
    return shard_map(body, mesh, {P(), P("x")}, P())(w, x);
  };
  auto grad_step = jit(value_and_grad(loss));
  for (float start : {-3.f, 5.f}) {
    const std::vector<float> v = iota(16, start);
    std::vector<float> squares(2, 0.f), col(2, 0.f);
    for (size_t i = 0; i < v.size(); ++i) {
      squares[i % 2] += v[i] * v[i];
      col[i % 2] += v[i];
    }
    std::vector<float> want(v.size());
    for (size_t i = 0; i < v.size(); ++i) want[i] = squares[i % 2] + v[i];
    const Array x = device_put(v, {16}, rows);
    EXPECT_EQ(gathered<float>(step(x)), want);
    const std::vector<float> wv = {start, 2.f - start};
    auto [l, g] = grad_step(device_put(wv, {2}, rep), x);
    EXPECT_EQ(gathered<float>(l),
              std::vector<float>{col[0] * wv[0] * wv[0] + col[1] * wv[1] * wv[1]});
    EXPECT_EQ(gathered<float>(g), (std::vector<float>{2 * wv[0] * col[0], 2 * wv[1] * col[1]}));
  }
  EXPECT_EQ(step.trace_count(), 1u);
  EXPECT_EQ(grad_step.trace_count(), 1u);
}

// The tensor-parallel layer's products placed by bytes (docs/global-view.md, "How a matmul is
// placed") across processes: the forward product as rows (a deferred pending sum taken by moving
// them, or read through its addends), the input gradient as rows, the weight gradient split_k.
TEST(Multiprocess, MatmulPlacedAsRowsAndSplitK) {
  Mesh mesh = make_mesh({8}, {"x"});
  const int64_t m = 4096, k = 64;
  std::vector<float> hx(static_cast<size_t>(m * k)), hw(static_cast<size_t>(k * k));
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>((i * 5 + 1) % 7) - 3.f;
  for (size_t i = 0; i < hw.size(); ++i) hw[i] = static_cast<float>((i * 3 + 2) % 5) - 2.f;
  Array x = device_put(hx, {m, k}, NamedSharding(mesh, P(None, "x")));
  Array w = device_put(hw, {k, k}, NamedSharding(mesh, P("x")));
  // Host products (small integers: exact in float32).
  std::vector<float> xw(static_cast<size_t>(m * k), 0.f), xwt(xw.size(), 0.f), xtx(hw.size(), 0.f);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c)
      for (int64_t j = 0; j < k; ++j) {
        xw[static_cast<size_t>(r * k + c)] +=
            hx[static_cast<size_t>(r * k + j)] * hw[static_cast<size_t>(j * k + c)];
        xwt[static_cast<size_t>(r * k + c)] +=
            hx[static_cast<size_t>(r * k + j)] * hw[static_cast<size_t>(c * k + j)];
      }
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b)
      for (int64_t r = 0; r < m; ++r)
        xtx[static_cast<size_t>(a * k + b)] +=
            hx[static_cast<size_t>(r * k + a)] * hx[static_cast<size_t>(r * k + b)];
  Array fwd = matmul(x, w);
  ASSERT_NE(detail::value_elsewhere(fwd), nullptr);
  EXPECT_EQ(gathered<float>(with_sharding_constraint(fwd, NamedSharding(mesh, P(None, "x")))), xw);
  EXPECT_EQ(gathered<float>(fwd * 1.0), xw);  // through the addends
  EXPECT_EQ(gathered<float>(matmul_transposed(x, w, false, true)), xwt);
  EXPECT_EQ(gathered<float>(matmul_transposed(x, x, true, false)), xtx);
}

// Blocks of thousands of bytes with odd element counts. Under multiprocess_{2x4,4x2}_pieces
// (MESHRT_MPI_MAX_MESSAGE_BYTES=999) every transfer between processes here is many MPI messages,
// their boundaries inside elements: reshards, process_allgather, a small psum (the partial sums
// travel with the agreement), a large one (shared by the devices, point to point), a
// deterministic one and all_gather (every input gathered), ppermute and all_to_all.
TEST(Multiprocess, TransfersOfManyMessages) {
  Mesh mesh = make_mesh({8}, {"x"});
  Mesh mesh2 = make_mesh({4, 2}, {"a", "b"});
  const int64_t rows = 24, cols = 1008;  // a device's 3 rows: 12096 bytes
  std::vector<int32_t> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 37) % 20011) - 10000;
  const auto at = [&](int64_t r, int64_t c) { return v[static_cast<size_t>(r * cols + c)]; };
  Array x = device_put(v, {rows, cols}, NamedSharding(mesh, P("x")));
  EXPECT_EQ(gathered<int32_t>(x), v);
  // Ranges of 3 x 126 (1512 bytes), whole blocks, the (4, 2) mesh's blocks.
  for (const NamedSharding& to :
       {NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P()),
        NamedSharding(mesh2, P("b", "a")), NamedSharding(mesh2, P(Axes{"a", "b"}))}) {
    Array y = device_put(x, to);
    EXPECT_EQ(gathered<int32_t>(y), v) << to.str();
    for (const Shard& s : y.addressable_shards()) {
      std::vector<int32_t> want;
      for (int64_t i = s.index[0].first; i < s.index[0].second; ++i)
        for (int64_t j = s.index[1].first; j < s.index[1].second; ++j) want.push_back(at(i, j));
      EXPECT_EQ(s.data.to_vector<int32_t>(), want) << to.str() << " on " << s.device.str();
    }
  }
  // 251 int64 per device (2008 bytes), replicated.
  std::vector<int64_t> w(8 * 251);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int64_t>(i * i) * 1000003 - 7;
  Array wx = device_put(w, {8 * 251}, NamedSharding(mesh, P("x")));
  EXPECT_EQ(device_put(wx, NamedSharding(mesh, P())).to_vector<int64_t>(), w);

  const auto run = [&](auto body, const Array& in, const PartitionSpec& out) {
    return shard_map(body, mesh, {P("x")}, out)(in);
  };
  std::vector<int32_t> sum(static_cast<size_t>(3 * cols), 0);
  for (int64_t d = 0; d < 8; ++d)
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < cols; ++c) sum[static_cast<size_t>(r * cols + c)] += at(d * 3 + r, c);
  EXPECT_EQ(
      gathered<int32_t>(run([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, x, P())),
      sum);
  CollectiveOptions o;
  o.deterministic = true;
  EXPECT_EQ(gathered<int32_t>(
                run([&](Context& c, const Tensor& t) { return c.psum(t, "x", o); }, x, P())),
            sum);
  // 20011 int32 per device (80044 bytes): above the small reductions' 32 KiB.
  const int64_t n = 20011;
  std::vector<int32_t> big(static_cast<size_t>(8 * n));
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int32_t>((i * 7919) % 4099) - 2049;
  std::vector<int32_t> big_sum(static_cast<size_t>(n), 0);
  for (int64_t d = 0; d < 8; ++d)
    for (int64_t i = 0; i < n; ++i)
      big_sum[static_cast<size_t>(i)] += big[static_cast<size_t>(d * n + i)];
  Array bx = device_put(big, {8 * n}, NamedSharding(mesh, P("x")));
  EXPECT_EQ(
      gathered<int32_t>(run([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, bx, P())),
      big_sum);
  // all_gather tiled: every device the whole array.
  EXPECT_EQ(gathered<int32_t>(run(
                [](Context& c, const Tensor& t) { return c.all_gather(t, "x", 0, true); }, x, P())),
            v);
  // ppermute by 3 blocks.
  Array sh = run(
      [](Context& c, const Tensor& t) {
        std::vector<std::pair<int64_t, int64_t>> perm;
        for (int64_t i = 0; i < 8; ++i) perm.push_back({i, (i + 3) % 8});
        return c.ppermute(t, "x", perm);
      },
      x, P("x"));
  std::vector<int32_t> shifted(v.size());
  for (int64_t d = 0; d < 8; ++d)
    for (int64_t e = 0; e < 3 * cols; ++e)
      shifted[static_cast<size_t>(((d + 3) % 8) * 3 * cols + e)] =
          v[static_cast<size_t>(d * 3 * cols + e)];
  EXPECT_EQ(gathered<int32_t>(sh), shifted);
  // all_to_all: [3, 1008] blocks split along columns, concatenated along rows: [24, 126].
  EXPECT_EQ(gathered<int32_t>(
                run([](Context& c, const Tensor& b) { return c.all_to_all(b, "x", 1, 0, true); }, x,
                    P(None, "x"))),
            v);
}

// bfloat16 across processes: a psum rounds once in direct's member order where one process holds
// the group or the call is deterministic; otherwise each process's partial is rounded too (within
// 2 bf16 ulps of one rounding, docs/meshes-shardings-arrays.md); an optimizer step on bf16 params
// sharded over the processes gives the replicated step's values within one bf16 ulp (its global
// norm is summed in another order).
TEST(Multiprocess, Bfloat16PsumAndOptimizerStep) {
  Mesh mesh = make_mesh({8}, {"x"});
  const int64_t n = 1000;
  std::vector<float> v(static_cast<size_t>(8 * n));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = 1.0f + 0.001f * static_cast<float>(i % 977) + 0.3f * static_cast<float>(i % 5);
  const Array x = astype(device_put(v, {8 * n}, NamedSharding(mesh, P("x"))), DType::bf16);
  const std::vector<float> xb = gathered<float>(astype(x, DType::f32));
  std::vector<float> once(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float acc = xb[static_cast<size_t>(i)];
    for (int64_t d = 1; d < 8; ++d) acc += xb[static_cast<size_t>(d * n + i)];
    once[static_cast<size_t>(i)] = static_cast<float>(bfloat16(acc));
  }
  for (bool deterministic : {false, true}) {
    CollectiveOptions o;
    o.deterministic = deterministic;
    const Array s = shard_map([&](Context& c, const Tensor& t) { return c.psum(t, "x", o); }, mesh,
                              {P("x")}, P())(x);
    EXPECT_EQ(s.dtype(), DType::bf16);
    const std::vector<float> got = gathered<float>(astype(s, DType::f32));
    for (int64_t i = 0; i < n; ++i) {
      const float want = once[static_cast<size_t>(i)], g = got[static_cast<size_t>(i)];
      if (deterministic || process_count() == 1) {
        ASSERT_EQ(g, want) << "element " << i << (deterministic ? " (deterministic)" : "");
      } else {
        ASSERT_LE(std::fabs(g - want), 2 * std::ldexp(1.0f, std::ilogb(want) - 7)) << i;
      }
    }
  }
  // Adam (with global-norm clipping) on bf16 params: sharded over the processes and replicated.
  const auto opt = optim::chain(optim::clip_by_global_norm(1.0), optim::adam(1e-2));
  std::vector<float> g(v.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
  std::vector<std::vector<float>> after;
  for (const PartitionSpec& spec : {P("x"), P()}) {
    const NamedSharding sh(mesh, spec);
    std::vector<Array> params{device_put(x, sh)};
    const std::vector<Array> grads{astype(device_put(g, {8 * n}, sh), DType::bf16)};
    auto state = opt.init(params);
    for (int step = 0; step < 3; ++step) {
      auto [updates, next] = opt.update(grads, state, params);
      params = optim::apply_updates(params, updates);
      state = next;
    }
    EXPECT_EQ(params[0].dtype(), DType::bf16);
    after.push_back(gathered<float>(astype(params[0], DType::f32)));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_LE(std::fabs(after[0][i] - after[1][i]), std::ldexp(1.0f, std::ilogb(after[1][i]) - 7))
        << i;
  }
}

TEST(Multiprocess, MismatchIsAnErrorOnEveryProcess) {
  if (process_count() == 1) GTEST_SKIP() << "needs several processes";
  Mesh mesh = make_mesh({8}, {"x"});
  Array x = device_put(iota(8 * 3), {8 * 3}, NamedSharding(mesh, P("x")));
  const bool odd = process_index() % 2 == 1;
  try {
    shard_map(
        [&](Context& c, const Tensor& t) {
          return odd ? c.pmax(t, "x") : c.psum(t, "x");  // different ops on different processes
        },
        mesh, {P("x")}, P())(x);
    ADD_FAILURE() << "a mismatched collective across processes did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("processes disagree"), std::string::npos) << m;
    EXPECT_NE(m.find("process 0 called"), std::string::npos) << m;
    EXPECT_NE(m.find("process 1 called"), std::string::npos) << m;
    EXPECT_NE(m.find("pmax(float32[3]"), std::string::npos) << m;
    EXPECT_NE(m.find("psum(float32[3]"), std::string::npos) << m;
  }
  // Shapes that differ between processes.
  try {
    Array y = device_put(iota(8 * 4), {8 * 4}, NamedSharding(mesh, P("x")));
    shard_map([&](Context& c, const Tensor& t) { return c.psum(odd ? t : t[0], "x"); }, mesh,
              {P("x")}, P(), {.check_replication = false})(y);
    ADD_FAILURE() << "a shape mismatch across processes did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("processes disagree"), std::string::npos) << e.what();
  }
  // The job is still usable afterwards.
  Array s =
      shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")}, P())(x);
  std::vector<float> want(3, 0.f);
  for (int d = 0; d < 8; ++d)
    for (int e = 0; e < 3; ++e) want[static_cast<size_t>(e)] += static_cast<float>(d * 3 + e);
  EXPECT_EQ(gathered<float>(s), want);
}

}  // namespace
}  // namespace meshrt

int main(int argc, char** argv) {
  meshrt::distributed::initialize();
  ::testing::InitGoogleTest(&argc, argv);
  // Every test is written for 8 devices in all; another count would index past the device list
  // or build meshes the tests do not expect. Every process sees the same count, so all stop.
  size_t count = 0;
  try {
    count = meshrt::devices("cpu").size();
  } catch (const meshrt::Error& e) {
    std::fprintf(stderr, "test_multiprocess: %s\n", e.what());
    return 2;
  }
  if (count != 8) {
    if (meshrt::process_index() == 0)
      std::fprintf(
          stderr,
          "test_multiprocess: needs 8 cpu devices in all (processes x MESHRT_CPU_DEVICES), "
          "got %zu; run it as CTest does, e.g. MESHRT_CPU_DEVICES=4 mpirun -n 2 %s\n",
          count, argv[0]);
    return 2;
  }
  return RUN_ALL_TESTS();
}
