// The process layer's transfers (backends/process_comm.h over Open MPI) split into many MPI
// messages: CTest runs this under mpirun with 3 processes and MESHRT_MPI_MAX_MESSAGE_BYTES=999, so
// every transfer above 999 bytes is a length and pieces whose boundaries fall anywhere. Checked,
// byte for byte against a pattern each side computes on its own: point-to-point transfers of
// every size around the cap (empty, one byte short, exact multiples, one byte over), several
// transfers between one pair under one tag (their pieces must not mix), the job's channel and a
// group's; exchanges of messages whose length travels inline or ahead of pieces; all-gathers
// whose total fits one MPI collective and ones whose offsets need the point-to-point path.
//
// BigTransfers moves more than INT_MAX bytes for real (2^31 + 4099 bytes each way between
// processes 0 and 1, and an all-gather whose total exceeds 2 GiB; about 4.3 GiB of memory per
// process): skipped unless MESHRT_TEST_BIG_TRANSFERS=1, e.g.
//   MESHRT_TEST_BIG_TRANSFERS=1 ctest -R multiprocess_comm_big
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/process_comm.h"
#include "core/config.h"

namespace meshrt {
namespace {

using Transfer = backend::ProcessComm::Transfer;

backend::ProcessComm& job() { return *backend::process_comm(); }
backend::ProcessComm::Deadline soon() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(60);
}
int64_t cap() { return config::mpi_max_message_bytes(); }

// Byte `i` of the transfer `id` from process `from` to process `to`: every byte differs from its
// neighbours and from the same byte of any other transfer, so a piece landing in the wrong place
// or the wrong transfer shows.
char pattern(int from, int to, int64_t id, int64_t i) {
  const uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull ^
                     static_cast<uint64_t>(from * 131 + to * 7 + id * 1009);
  return static_cast<char>((x >> 29) ^ (x >> 7) ^ static_cast<uint64_t>(i));
}

std::vector<char> filled(int from, int to, int64_t id, int64_t bytes) {
  std::vector<char> v(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i) v[static_cast<size_t>(i)] = pattern(from, to, id, i);
  return v;
}

// The first byte of `got` that differs from the transfer's pattern, or -1.
int64_t first_wrong(const std::vector<char>& got, int from, int to, int64_t id) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != pattern(from, to, id, static_cast<int64_t>(i))) return static_cast<int64_t>(i);
  }
  return -1;
}

// Sizes around the cap and its multiples.
std::vector<int64_t> sizes_around_cap() {
  const int64_t c = cap();
  return {0, 1, c - 1, c, c + 1, 2 * c, 3 * c - 1, 5 * c + 7, 40 * c + 13, 100003};
}

// Every process sends every size to every other process, and receives the same from each: all
// transfers between a pair under one tag (their order is all that keeps their pieces apart),
// then each under a tag of its own.
void send_recv_every_size(bool group) {
  const int me = job().rank(), n = job().size();
  std::vector<int> procs(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) procs[static_cast<size_t>(p)] = p;
  const std::vector<int64_t> sizes = sizes_around_cap();
  for (bool one_tag : {true, false}) {
    std::vector<std::vector<char>> out, in;
    std::vector<Transfer> sends, recvs;
    out.reserve(sizes.size() * static_cast<size_t>(n));
    in.reserve(sizes.size() * static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      for (size_t k = 0; k < sizes.size(); ++k) {
        const int tag = one_tag ? 7 : static_cast<int>(k);
        const auto id = static_cast<int64_t>(k);
        out.push_back(filled(me, p, id, sizes[k]));
        sends.push_back({p, tag, out.back().data(), sizes[k]});
        in.emplace_back(static_cast<size_t>(sizes[k]), '\0');
        recvs.push_back({p, tag, in.back().data(), sizes[k]});
      }
    }
    const std::string what = group ? "the test's group transfers" : "the test's transfers";
    const std::vector<int> missing =
        group ? job().send_recv_group(procs, 1, sends, recvs, soon(), what)
              : job().send_recv(sends, recvs, soon(), what);
    ASSERT_TRUE(missing.empty()) << what;
    size_t r = 0;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      for (size_t k = 0; k < sizes.size(); ++k, ++r) {
        EXPECT_EQ(first_wrong(in[r], p, me, static_cast<int64_t>(k)), -1)
            << what << ": " << sizes[k] << " bytes from process " << p
            << (one_tag ? ", one tag" : ", a tag each");
      }
    }
  }
}

TEST(MultiprocessComm, TheCapIsSmall) {
  // The transfers below are many messages only when CTest's small cap is in effect.
  if (std::getenv("MESHRT_MPI_MAX_MESSAGE_BYTES") != nullptr) EXPECT_LT(cap(), 4096);
  EXPECT_GE(job().size(), 2);
}

TEST(MultiprocessComm, SendRecvOfManyPieces) { send_recv_every_size(false); }

TEST(MultiprocessComm, SendRecvGroupOfManyPieces) { send_recv_every_size(true); }

TEST(MultiprocessComm, ExchangeOfManyPieces) {
  const int me = job().rank(), n = job().size();
  std::vector<int> procs(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) procs[static_cast<size_t>(p)] = p;
  const int64_t c = cap();
  // Inline with the length (up to the smaller of the cap and 64 KiB, less 8), and ahead of it.
  const std::vector<int64_t> sizes = {0, 5,     c - 9,     c - 8,         c - 7,
                                      c, c + 1, 3 * c + 2, 64 * 1024 - 7, 200001};
  for (size_t round = 0; round < sizes.size(); ++round) {
    // Each process a different size in each round.
    const auto size_of = [&](int p) {
      return sizes[(round + static_cast<size_t>(p)) % sizes.size()];
    };
    const std::vector<char> mine = filled(me, -1, static_cast<int64_t>(round), size_of(me));
    std::vector<std::string> out;
    ASSERT_TRUE(job()
                    .exchange(procs, 11, std::string(mine.begin(), mine.end()), out, soon(),
                              "the test's exchange")
                    .empty());
    ASSERT_EQ(out.size(), procs.size());
    for (int p = 0; p < n; ++p) {
      const std::string& got = out[static_cast<size_t>(p)];
      ASSERT_EQ(static_cast<int64_t>(got.size()), size_of(p))
          << "round " << round << ", from " << p;
      EXPECT_EQ(first_wrong(std::vector<char>(got.begin(), got.end()), p, -1,
                            static_cast<int64_t>(round)),
                -1)
          << "round " << round << ": " << got.size() << " bytes from process " << p;
    }
  }
}

// counts[k] bytes from each process of `procs`, concatenated in procs order.
void all_gather_checked(const std::vector<int>& procs, int key, const std::vector<int64_t>& counts,
                        int64_t id) {
  const int me = job().rank();
  size_t mine = 0;
  int64_t total = 0;
  for (size_t k = 0; k < procs.size(); ++k) {
    if (procs[k] == me) mine = k;
    total += counts[k];
  }
  const std::vector<char> in = filled(me, -1, id, counts[mine]);
  std::vector<char> out(static_cast<size_t>(total), '\0');
  ASSERT_TRUE(job().all_gather(procs, key, in.data(), out.data(), counts, soon()));
  int64_t at = 0;
  for (size_t k = 0; k < procs.size(); ++k) {
    const std::vector<char> part(out.begin() + at, out.begin() + at + counts[k]);
    EXPECT_EQ(first_wrong(part, procs[k], -1, id), -1)
        << counts[k] << " bytes from process " << procs[k] << " of " << total;
    at += counts[k];
  }
}

TEST(MultiprocessComm, AllGatherOfManyPieces) {
  const int me = job().rank(), n = job().size();
  std::vector<int> all(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) all[static_cast<size_t>(p)] = p;
  const int64_t c = cap();
  int64_t id = 0;
  // Totals within the cap (one MPI collective), just above it, and far above it; uneven counts,
  // an empty one among them.
  for (int64_t base : {int64_t{0}, c / 4, c / 2, 7 * c + 3}) {
    std::vector<int64_t> counts;
    for (int p = 0; p < n; ++p) counts.push_back(base == 0 ? p : base + 13 * p);
    all_gather_checked(all, 2, counts, id++);
  }
  std::vector<int64_t> with_empty(static_cast<size_t>(n), 5 * c + 1);
  with_empty[1] = 0;
  all_gather_checked(all, 2, with_empty, id++);
  // A group of part of the job: the first and last process.
  if (me == 0 || me == n - 1) all_gather_checked({0, n - 1}, 3, {3 * c + 1, 2 * c - 1}, id);
}

TEST(MultiprocessComm, BigTransfers) {
  const char* big = std::getenv("MESHRT_TEST_BIG_TRANSFERS");
  if (big == nullptr || std::string(big) != "1")
    GTEST_SKIP() << "set MESHRT_TEST_BIG_TRANSFERS=1 to move 2^31 + 4099 bytes between processes "
                    "(about 4.3 GiB of memory per process)";
  const int me = job().rank();
  if (me > 1) return;
  const int peer = 1 - me;
  const int64_t bytes = (int64_t{1} << 31) + 4099;  // above INT_MAX: never one MPI message
  {
    std::vector<char> out = filled(me, peer, 0, bytes);
    std::vector<char> in(static_cast<size_t>(bytes), '\0');
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(job()
                    .send_recv({{peer, 3, out.data(), bytes}}, {{peer, 3, in.data(), bytes}},
                               std::chrono::steady_clock::now() + std::chrono::minutes(10),
                               "the test's 2 GiB transfer")
                    .empty());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(first_wrong(in, peer, me, 0), -1);
    if (me == 0) std::printf("2^31 + 4099 bytes each way between 2 processes: %.2f s\n", s);
  }
  // An all-gather whose offsets pass INT_MAX: 2^30 + 12345 bytes from each of the two.
  const int64_t half = (int64_t{1} << 30) + 12345;
  all_gather_checked({0, 1}, 4, {half, half}, 1);
}

}  // namespace
}  // namespace meshrt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  meshrt::backend::set_process_comm(meshrt::backend::make_mpi_comm(std::chrono::seconds(60)));
  return RUN_ALL_TESTS();
}
