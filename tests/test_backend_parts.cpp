// Pieces of backends/ that the cuda platform relies on, checked on cpu with host stand-ins: the
// block cache (blocks released outside its lock), pitched copies (no 2-D copy with a pitch the
// call cannot take), and the native communicator cache (failures not cached, bounded, nothing
// destroyed that a member may still use).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "backends/block_cache.h"
#include "backends/comm_cache.h"
#include "backends/cpu/kernels.h"
#include "backends/pitched_copy.h"
#include "core/error.h"

namespace meshrt {
namespace {

// Whether `f` finishes on another thread within two seconds (it blocks on a lock held here if
// the caller holds it). On a timeout the thread is left behind, blocked: the test has failed.
bool runs_elsewhere(std::function<void()> f) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([f = std::move(f), done] {
    f();
    *done = true;
  }).detach();
  for (int i = 0; i < 2000 && !*done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return *done;
}

TEST(BlockCache, ReleasesBlocksOutsideItsLock) {
  backend::BlockCache* cache = nullptr;
  int released = 0;
  bool unlocked = true;
  backend::BlockCache c(4096, [&](void* p) {
    // cudaFree waits for the GPU here; the cache must stay usable meanwhile.
    unlocked &= runs_elsewhere([cache] { (void)cache->cached_bytes(); });
    std::free(p);
    ++released;
  });
  cache = &c;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(c.give(std::malloc(1024), 1024));
  EXPECT_EQ(c.cached_bytes(), 4096u);
  EXPECT_TRUE(c.give(std::malloc(1024), 1024));  // over the limit: the largest block goes
  EXPECT_EQ(released, 1);
  EXPECT_EQ(c.trim(), 4096u);
  EXPECT_EQ(released, 5);
  EXPECT_TRUE(unlocked) << "a block was released while the cache's lock was held";
}

// A copy through stand-in 1-D and 2-D calls on host memory, recording what was issued.
struct Issued {
  int one_d = 0, two_d = 0;
  size_t max_pitch_seen = 0;
};
int pitched(std::vector<char>& dst, size_t dpitch, const std::vector<char>& src, size_t spitch,
            size_t width, size_t height, size_t max_pitch, Issued& is, int fail_at = -1) {
  return backend::pitched_copy<int>(
      dst.data(), dpitch, src.data(), spitch, width, height, max_pitch,
      [&](void* d, const void* s, size_t bytes) {
        if (is.one_d++ == fail_at) return 7;
        std::memcpy(d, s, bytes);
        return 0;
      },
      [&](void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h) {
        ++is.two_d;
        is.max_pitch_seen = std::max({is.max_pitch_seen, dp, sp});
        for (size_t r = 0; r < h; ++r)
          std::memcpy(static_cast<char*>(d) + r * dp, static_cast<const char*>(s) + r * sp, w);
        return 0;
      });
}

TEST(PitchedCopy, NeverPassesAPitchBeyondTheLimit) {
  std::vector<char> src(4000);
  std::iota(src.begin(), src.end(), 0);
  auto expect = [&](size_t dpitch, size_t spitch, size_t width, size_t height) {
    std::vector<char> want(4000, 0);
    for (size_t r = 0; r < height; ++r)
      std::memcpy(want.data() + r * dpitch, src.data() + r * spitch, width);
    return want;
  };
  {  // contiguous rows: one 1-D copy
    std::vector<char> dst(4000, 0);
    Issued is;
    EXPECT_EQ(pitched(dst, 100, src, 100, 100, 30, 64, is), 0);
    EXPECT_EQ(dst, expect(100, 100, 100, 30));
    EXPECT_EQ(is.one_d, 1);
    EXPECT_EQ(is.two_d, 0);
  }
  {  // pitches within the limit: one 2-D copy
    std::vector<char> dst(4000, 0);
    Issued is;
    EXPECT_EQ(pitched(dst, 90, src, 120, 40, 30, 128, is), 0);
    EXPECT_EQ(dst, expect(90, 120, 40, 30));
    EXPECT_EQ(is.two_d, 1);
    EXPECT_EQ(is.one_d, 0);
  }
  {  // a pitch beyond the limit (cudaMemcpy2D's 2^31 - 1, scaled down): row by row
    std::vector<char> dst(4000, 0);
    Issued is;
    EXPECT_EQ(pitched(dst, 90, src, 300, 40, 12, 128, is), 0);
    EXPECT_EQ(dst, expect(90, 300, 40, 12));
    EXPECT_EQ(is.two_d, 0);
    EXPECT_EQ(is.one_d, 12);
  }
  {  // the first failing row stops the copy and is reported
    std::vector<char> dst(4000, 0);
    Issued is;
    EXPECT_EQ(pitched(dst, 90, src, 300, 40, 12, 128, is, /*fail_at=*/3), 7);
    EXPECT_EQ(is.one_d, 4);
  }
}

// A stand-in library: communicators are ints; devices' fence counts are set by the test.
struct FakeLibrary {
  int created = 0, destroyed = 0;
  bool fail_next = false;
  std::vector<uint64_t> fences = std::vector<uint64_t>(8, 0);
  std::set<int> live;
  backend::CommCache<int>* cache = nullptr;
  bool destroyed_unlocked = true;

  backend::CommCache<int>::Hooks hooks() {
    return {[this](const std::vector<int>& group) {
              if (fail_next) {
                fail_next = false;
                throw Error("[fake] init failed");
              }
              std::vector<int> comms;
              const int set = ++created;
              for (size_t r = 0; r < group.size(); ++r) {
                comms.push_back(set * 100 + static_cast<int>(r));
                live.insert(comms.back());
              }
              return comms;
            },
            [this](const std::vector<int>&, std::vector<int>& comms) {
              destroyed_unlocked &= runs_elsewhere([c = cache] { (void)c->size(); });
              for (int c : comms) EXPECT_EQ(live.erase(c), 1u) << "destroyed twice";
              ++destroyed;
            },
            [this](int d) { return fences[static_cast<size_t>(d)]; }};
  }
};

// Every member launches one call on `group` and then fences.
void one_collective(backend::CommCache<int>& cache, FakeLibrary& lib,
                    const std::vector<int>& group) {
  for (int d : group) {
    auto lease = cache.acquire(group, d);
    lease.launched();
  }
  for (int d : group) ++lib.fences[static_cast<size_t>(d)];
}

// The cpu platform's copy_2d splits copies above 1 MiB across the cores: contiguous runs in
// chunks, pitched ones by rows. Every byte lands where a plain row-by-row memcpy puts it, and
// nothing between the rows is touched.
TEST(CpuCopy2d, LargeCopiesMatchARowByRowCopy) {
  struct Case {
    size_t width, height, dpitch, spitch;
  };
  for (const Case& c : std::vector<Case>{{(3 << 20) + 5, 1, 0, 0},  // one long row
                                         {4096, 1000, 4096, 4096},  // contiguous rows
                                         {4000, 1000, 5000, 6016},  // pitched rows
                                         {12, 200000, 20, 12},      // many narrow rows
                                         {100, 7, 100, 100}}) {     // small: one memcpy
    const size_t dp = c.dpitch == 0 ? c.width : c.dpitch, sp = c.spitch == 0 ? c.width : c.spitch;
    std::vector<unsigned char> src(sp * (c.height - 1) + c.width),
        got(dp * (c.height - 1) + c.width, 0xab), want = got;
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + i / 251);
    for (size_t r = 0; r < c.height; ++r)
      std::memcpy(want.data() + r * dp, src.data() + r * sp, c.width);
    cpu::copy_2d(got.data(), dp, src.data(), sp, c.width, c.height);
    EXPECT_TRUE(got == want) << c.width << " x " << c.height;
  }
}

TEST(CommCache, OneSetPerOrderedGroupAndRanksInGroupOrder) {
  FakeLibrary lib;
  backend::CommCache<int> cache(8, lib.hooks());
  lib.cache = &cache;
  {
    auto a = cache.acquire({2, 0, 1}, 0);
    EXPECT_EQ(a.rank(), 1);
    auto b = cache.acquire({2, 0, 1}, 2);
    EXPECT_EQ(b.rank(), 0);
    EXPECT_EQ(a.comm() / 100, b.comm() / 100);  // one set, made once
  }
  (void)cache.acquire({0, 1, 2}, 0);  // another order: another set
  EXPECT_EQ(lib.created, 2);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(CommCache, AFailedCreationIsNotCached) {
  FakeLibrary lib;
  backend::CommCache<int> cache(8, lib.hooks());
  lib.cache = &cache;
  lib.fail_next = true;
  EXPECT_THROW((void)cache.acquire({0, 1}, 0), Error);
  EXPECT_EQ(cache.size(), 0u);
  auto lease = cache.acquire({0, 1}, 1);  // tries again
  EXPECT_EQ(lib.created, 1);
  EXPECT_NE(lease.comm(), 0);
}

TEST(CommCache, BoundedLeastRecentlyUsedFirst) {
  FakeLibrary lib;
  backend::CommCache<int> cache(2, lib.hooks());
  lib.cache = &cache;
  one_collective(cache, lib, {0, 1});
  one_collective(cache, lib, {2, 3});
  one_collective(cache, lib, {4, 5});  // {0, 1} is the least recently used idle set
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(lib.destroyed, 1);
  EXPECT_EQ(lib.live.count(100), 0u) << "not the least recently used set";
  EXPECT_TRUE(lib.destroyed_unlocked) << "communicators were destroyed under the cache's lock";
}

// Whether making room for another group destroys {0, 1}'s set after `setup` used it.
bool evicted_after(
    const std::function<void(backend::CommCache<int>&, FakeLibrary&,
                             std::optional<backend::CommCache<int>::Lease>&)>& setup) {
  FakeLibrary lib;
  backend::CommCache<int> cache(1, lib.hooks());
  lib.cache = &cache;
  std::optional<backend::CommCache<int>::Lease> held;
  setup(cache, lib, held);
  (void)cache.acquire({2, 3}, 2);
  EXPECT_EQ(cache.size(), lib.destroyed == 1 ? 1u : 2u);
  return lib.destroyed == 1;
}

TEST(CommCache, NeverDestroysASetAMemberMayStillUse) {
  using Lease = std::optional<backend::CommCache<int>::Lease>;
  using Cache = backend::CommCache<int>;
  EXPECT_TRUE(evicted_after([](Cache& c, FakeLibrary& lib, Lease&) {
    one_collective(c, lib, {0, 1});  // launched and fenced by both
  }));
  EXPECT_TRUE(evicted_after([](Cache& c, FakeLibrary&, Lease&) { (void)c.acquire({0, 1}, 0); }));
  EXPECT_FALSE(evicted_after([](Cache& c, FakeLibrary& lib, Lease&) {
    one_collective(c, lib, {0, 1});
    c.acquire({0, 1}, 0).launched();  // member 1 has not launched its part yet
  })) << "destroyed while a member was mid-collective";
  EXPECT_FALSE(evicted_after([](Cache& c, FakeLibrary& lib, Lease&) {
    c.acquire({0, 1}, 0).launched();
    c.acquire({0, 1}, 1).launched();
    ++lib.fences[0];  // device 1 has not fenced: its kernel may still run
  })) << "destroyed with work in flight";
  EXPECT_FALSE(evicted_after([](Cache& c, FakeLibrary& lib, Lease& held) {
    one_collective(c, lib, {0, 1});
    held.emplace(c.acquire({0, 1}, 1));  // about to launch
  })) << "destroyed under a held lease";
}

}  // namespace
}  // namespace meshrt
