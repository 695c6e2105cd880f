// One device's side of every collective: the direct one-shot algorithm, the ring forms (over
// Transport) and the platform's native library (NCCL), all moving memory through a Plane
// (collectives/plane.h) so the same code serves host memory and GPU memory.
#include "collectives/collective.h"

#include <cstring>

#include "backends/native_comm.h"
#include "collectives/plane.h"
#include "collectives/reduce.h"
#include "collectives/ring.h"
#include "collectives/transport.h"
#include "core/strided.h"
#include "core/threads/wait.h"

namespace meshrt::coll {

namespace {

using Shape = std::vector<int64_t>;

bool is_reduction(Kind k) {
  return k == Kind::psum || k == Kind::pmean || k == Kind::pmax || k == Kind::pmin;
}

DType out_dtype(const Call& c) { return c.kind == Kind::pmean ? pmean_dtype(c.dtype) : c.dtype; }

int64_t count(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

const char* in_ptr(const Instance& inst, int64_t j) {
  return static_cast<const char*>(inst.slot(j).in);
}
char* out_ptr(const Instance& inst, int64_t j) { return static_cast<char*>(inst.slot(j).out); }
Plane plane_of(const Instance& inst, int64_t j) {
  return Plane(inst.slot(j).backend, inst.slot(j).device);
}

// Copies `extent` elements between two strided views (element size `elem`).
void copy_view(const Plane& pl, char* dst, const core::View& dv, const char* src,
               const core::View& sv, const Shape& extent, size_t elem) {
  const auto e = static_cast<int64_t>(elem);
  core::for_each_runs(extent, {&dv, &sv}, [&](const core::Runs& r) {
    pl.copy_2d(dst + r.offsets[0] * e, static_cast<size_t>(r.pitches[0] * e),
               src + r.offsets[1] * e, static_cast<size_t>(r.pitches[1] * e),
               static_cast<size_t>(r.run * e), static_cast<size_t>(r.rows));
  });
}

// Inserts a dimension of `size` with `stride` at `at` into a view.
core::View insert_dim(core::View v, size_t at, int64_t stride) {
  v.strides.insert(v.strides.begin() + static_cast<std::ptrdiff_t>(at), stride);
  return v;
}

// Small reductions: the last arriver computes the result once and writes every output.
void reduce_small(const Instance& inst, const Plane& pl) {
  const Call& c = inst.call();
  const int64_t n = count(c.shape);
  std::vector<const void*> srcs(static_cast<size_t>(inst.size()));
  for (int64_t j = 0; j < inst.size(); ++j) srcs[static_cast<size_t>(j)] = inst.slot(j).in;
  const DType od = out_dtype(c);
  char* first = out_ptr(inst, 0);
  pl.fold(c.kind, c.dtype, od, first, srcs, n);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(od);
  for (int64_t j = 1; j < inst.size(); ++j) pl.copy(out_ptr(inst, j), first, bytes);
  pl.fence();
}

// Large reductions: device `me` owns slice `me`, reduces it tile by tile and pushes each tile to
// every output while it is in cache; then waits until every slice has been pushed.
void reduce_large(Instance& inst, int64_t me) {
  const Call& c = inst.call();
  const Plane pl = plane_of(inst, me);
  const int64_t n = count(c.shape), N = inst.size();
  const DType od = out_dtype(c);
  const size_t ie = dtype_size(c.dtype), oe = dtype_size(od);
  const int64_t slice = (n + N - 1) / N;
  const int64_t lo = std::min(n, me * slice), hi = std::min(n, lo + slice);
  // Host: tiles of elements that fit in L2 with their N inputs. Device: one kernel for the slice.
  const int64_t kTile = pl.host() ? 16 * 1024 : std::max<int64_t>(1, hi - lo);
  std::vector<const void*> srcs(static_cast<size_t>(N));
  char* mine = out_ptr(inst, me);
  for (int64_t base = lo; base < hi; base += kTile) {
    const int64_t m = std::min(kTile, hi - base);
    for (int64_t j = 0; j < N; ++j)
      srcs[static_cast<size_t>(j)] = in_ptr(inst, j) + base * static_cast<int64_t>(ie);
    char* dst = mine + base * static_cast<int64_t>(oe);
    pl.fold(c.kind, c.dtype, od, dst, srcs, m);
    for (int64_t j = 0; j < N; ++j) {
      if (j != me)
        pl.copy(out_ptr(inst, j) + base * static_cast<int64_t>(oe), dst,
                static_cast<size_t>(m) * oe);
    }
  }
  pl.fence();
  std::atomic<uint32_t>& done = inst.phase_counter();
  if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(N)) {
    core::wake_all(done);
    return;
  }
  for (uint32_t v; (v = done.load(std::memory_order_acquire)) != static_cast<uint32_t>(N);) {
    core::wait_while(done, v, std::chrono::seconds(1), inst.oversubscribed());
  }
}

// Places member j's block (dense, starting at block_of(j)) at position j of device `me`'s output:
// concatenated along the axis (tiled) or stacked in a new dimension there.
template <class Blocks>
void all_gather_from(const Instance& inst, int64_t me, const Shape& out_shape, Blocks block_of) {
  const Call& c = inst.call();
  const size_t elem = dtype_size(c.dtype);
  const auto a = static_cast<size_t>(c.axis);
  Shape extent = c.shape;
  core::View src{0, core::dense_strides(c.shape)};
  if (!c.tiled) {
    extent.insert(extent.begin() + static_cast<std::ptrdiff_t>(a), 1);
    src = insert_dim(src, a, 0);
  }
  for (int64_t j = 0; j < inst.size(); ++j) {
    Shape start(out_shape.size(), 0);
    start[a] = c.tiled ? j * c.shape[a] : j;
    copy_view(plane_of(inst, me), out_ptr(inst, me), core::box_view(out_shape, start), block_of(j),
              src, extent, elem);
  }
}

void all_gather(const Instance& inst, int64_t me, const Shape& out_shape) {
  all_gather_from(inst, me, out_shape, [&](int64_t j) { return in_ptr(inst, j); });
}

// Device `me`'s block of the sum, folded in group-index order; member j's input starts at
// input_of(j) (its own input buffer, or a gathered copy of it).
template <class Inputs>
void psum_scatter_from(const Instance& inst, int64_t me, const Shape& out_shape, Inputs input_of) {
  const Call& c = inst.call();
  const int64_t N = inst.size();
  const auto sd = static_cast<size_t>(c.axis);
  const size_t elem = dtype_size(c.dtype);
  Shape extent = c.shape, start(c.shape.size(), 0);
  extent[sd] = c.tiled ? c.shape[sd] / N : 1;
  start[sd] = me * extent[sd];
  const core::View src = core::box_view(c.shape, start);
  core::View dst{0, core::dense_strides(out_shape)};
  if (!c.tiled) dst = insert_dim(dst, sd, 0);
  std::vector<const core::View*> views{&dst};
  for (int64_t j = 0; j < N; ++j) views.push_back(&src);  // same box in every input
  std::vector<const void*> srcs(static_cast<size_t>(N));
  char* out = out_ptr(inst, me);
  const Plane pl = plane_of(inst, me);
  const auto e = static_cast<int64_t>(elem);
  core::for_each_runs(extent, views, [&](const core::Runs& r) {
    for (int64_t j = 0; j < N; ++j) srcs[static_cast<size_t>(j)] = input_of(j) + r.offsets[1] * e;
    pl.fold_rows(Kind::psum, c.dtype, out + r.offsets[0] * e, r.pitches[0], srcs, r.pitches[1],
                 r.run, r.rows);
  });
}

void psum_scatter(const Instance& inst, int64_t me, const Shape& out_shape) {
  psum_scatter_from(inst, me, out_shape, [&](int64_t j) { return in_ptr(inst, j); });
}

void ppermute(const Instance& inst, int64_t me) {
  const Call& c = inst.call();
  const Plane pl = plane_of(inst, me);
  const size_t bytes = static_cast<size_t>(count(c.shape)) * dtype_size(c.dtype);
  for (auto [s, d] : c.perm) {
    if (d == me) {
      pl.copy(out_ptr(inst, me), in_ptr(inst, s), bytes);
      return;
    }
  }
  pl.zero(out_ptr(inst, me), bytes);  // nothing arrives here: zeros, as in JAX
}

// all_to_all's pieces: member j sends member i the piece of its input at index i along the
// split axis (a box when tiled, one index when not); i places it at position j along concat.
struct A2APieces {
  A2APieces(const Call& c, const Shape& out_shape, int64_t n) : call(c), out(out_shape) {
    const auto split = static_cast<size_t>(c.axis);
    extent = c.shape;
    if (c.tiled)
      extent[split] = c.shape[split] / n;
    else
      extent.erase(extent.begin() + static_cast<std::ptrdiff_t>(split));
  }
  // Where the piece for member `to` lies in a sender's input.
  core::View src(int64_t to) const {
    const auto split = static_cast<size_t>(call.axis);
    if (call.tiled) {
      Shape start(call.shape.size(), 0);
      start[split] = to * extent[split];
      return core::box_view(call.shape, start);
    }
    core::View v{0, core::dense_strides(call.shape)};
    v.offset = to * v.strides[split];
    v.strides.erase(v.strides.begin() + static_cast<std::ptrdiff_t>(split));
    return v;
  }
  // Where the piece from member `from` goes in a receiver's output.
  core::View dst(int64_t from) const {
    const auto concat = static_cast<size_t>(call.axis2);
    if (call.tiled) {
      Shape start(out.size(), 0);
      start[concat] = from * extent[concat];
      return core::box_view(out, start);
    }
    core::View v{0, core::dense_strides(out)};
    v.offset = from * v.strides[concat];
    v.strides.erase(v.strides.begin() + static_cast<std::ptrdiff_t>(concat));
    return v;
  }
  const Call& call;
  const Shape& out;
  Shape extent;
};

// pairwise: step s exchanges with the peers at distance s (pulls from me - s), the schedule
// the ring family uses; direct pulls in member order.
void all_to_all(const Instance& inst, int64_t me, const Shape& out_shape, bool pairwise) {
  const Call& c = inst.call();
  const int64_t N = inst.size();
  const A2APieces pieces(c, out_shape, N);
  const core::View src = pieces.src(me);
  for (int64_t step = 0; step < N; ++step) {
    const int64_t j = pairwise ? ((me - step) % N + N) % N : step;
    copy_view(plane_of(inst, me), out_ptr(inst, me), pieces.dst(j), in_ptr(inst, j), src,
              pieces.extent, dtype_size(c.dtype));
  }
}

// A member's work buffer: the one it was given, else its output.
char* work_of(const Instance& inst, int64_t j) {
  return static_cast<char*>(inst.slot(j).work ? inst.slot(j).work : inst.slot(j).out);
}

// Transport over the members' buffers in the instance's slots: the acting member's plane moves
// the bytes (host memcpy, or its GPU's copies and kernels); progress counters live on the host.
class SlotTransport final : public Transport {
 public:
  SlotTransport(Session& session, int64_t pos, Instance& inst, int64_t me)
      : session_(session), pos_(pos), inst_(inst), pl_(plane_of(inst, me)) {}
  void copy(int64_t dst, Buf db, int64_t doff, int64_t src, Buf sb, int64_t soff,
            int64_t bytes) override {
    pl_.copy(ptr(dst, db) + doff, ptr(src, sb) + soff, static_cast<size_t>(bytes));
  }
  void reduce(Kind op, DType dt, int64_t dst, Buf db, int64_t doff, int64_t src, Buf sb,
              int64_t soff, int64_t count) override {
    const int64_t e = static_cast<int64_t>(dtype_size(dt));
    char* d = ptr(dst, db) + doff * e;
    pl_.fold(op == Kind::pmean ? Kind::psum : op, dt, dt, d, {ptr(src, sb) + soff * e, d}, count);
  }
  // Host memory: the bytes are there when the call returns. Device memory: the unit's work is
  // only queued; a token (a GPU event) marks it, and a waiting peer's stream waits on the token,
  // so no host thread waits on a stream between pieces.
  void signal(int64_t me, uint32_t unit) override {
    if (!pl_.host()) inst_.put_token(me, unit, pl_.backend()->coll_signal(pl_.device()));
    inst_.advance(me, unit);
  }
  void wait(int64_t member, uint32_t unit) override {
    session_.wait_progress(pos_, inst_, member, unit);
    if (!pl_.host()) pl_.backend()->coll_wait_token(pl_.device(), inst_.token(member, unit));
  }

 private:
  char* ptr(int64_t m, Buf b) const {
    const Slot& s = inst_.slot(m);
    if (b == Buf::in) return const_cast<char*>(static_cast<const char*>(s.in));
    return work_of(inst_, m);
  }
  Session& session_;
  int64_t pos_;  // the acting device's mesh position
  Instance& inst_;
  Plane pl_;
};

// Ring pipelining granularity: pieces that stay in cache on the host; on GPUs, pieces large
// enough that a 256 MiB collective queues tens of steps, not thousands.
int64_t piece_bytes(const Instance& inst, int64_t me) {
  return plane_of(inst, me).host() ? int64_t{256} << 10 : int64_t{8} << 20;
}

// Ring / bidirectional-ring forms. Work buffers hold flat chunk-major data; local copies before
// and after arrange it from and into the collective's layout.
// Deterministic form: ring-all-gather every input over the transport, then fold them locally in
// group-index order, exactly as direct does (same bits for every algorithm).
void gather_inputs(Session& session, int64_t pos, Instance& inst, int64_t me) {
  const Call& c = inst.call();
  const int64_t n = count(c.shape), N = inst.size();
  const size_t ie = dtype_size(c.dtype);
  char* work = work_of(inst, me);
  plane_of(inst, me).copy(work + me * n * static_cast<int64_t>(ie), inst.slot(me).in,
                          static_cast<size_t>(n) * ie);
  SlotTransport t(session, pos, inst, me);
  run_ring(t, RingPhase::all_gather, Kind::psum, c.dtype, me, N, N * n, c.algo == Algo::bidi_ring,
           1, piece_bytes(inst, me));
}

void ring_reduce(Session& session, int64_t pos, Instance& inst, int64_t me) {
  const Call& c = inst.call();
  const int64_t n = count(c.shape), N = inst.size();
  const size_t ie = dtype_size(c.dtype);
  char* work = work_of(inst, me);
  if (c.deterministic) {
    gather_inputs(session, pos, inst, me);
    std::vector<const void*> srcs;
    for (int64_t j = 0; j < N; ++j) srcs.push_back(work + j * n * static_cast<int64_t>(ie));
    plane_of(inst, me).fold(c.kind, c.dtype, out_dtype(c), out_ptr(inst, me), srcs, n);
    return;
  }
  plane_of(inst, me).copy(work, inst.slot(me).in, static_cast<size_t>(n) * ie);
  SlotTransport t(session, pos, inst, me);
  run_ring(t, RingPhase::all_reduce, c.kind, c.dtype, me, N, n, c.algo == Algo::bidi_ring, 1,
           piece_bytes(inst, me));
  if (c.kind == Kind::pmean)
    plane_of(inst, me).mean_from_sum(c.dtype, out_dtype(c), out_ptr(inst, me), work, n, N);
}

// psum_scatter's input rearranged chunk-major into `work`: chunk k = this device's block k along
// the scatter dimension, dense. Returns the elements per chunk.
int64_t stage_scatter_chunks(const Instance& inst, int64_t me, char* work) {
  const Call& c = inst.call();
  const int64_t N = inst.size();
  const auto sd = static_cast<size_t>(c.axis);
  const size_t elem = dtype_size(c.dtype);
  Shape block = c.shape;
  block[sd] = c.tiled ? c.shape[sd] / N : 1;
  const int64_t C = count(block);
  for (int64_t k = 0; k < N; ++k) {
    Shape start(c.shape.size(), 0);
    start[sd] = k * block[sd];
    copy_view(plane_of(inst, me), work + k * C * static_cast<int64_t>(elem),
              core::View{0, core::dense_strides(block)}, in_ptr(inst, me),
              core::box_view(c.shape, start), block, elem);
  }
  return C;
}

void ring_psum_scatter(Session& session, int64_t pos, Instance& inst, int64_t me,
                       const Shape& out_shape) {
  const Call& c = inst.call();
  const int64_t N = inst.size(), n = count(c.shape);
  const auto sd = static_cast<size_t>(c.axis);
  const size_t elem = dtype_size(c.dtype);
  if (c.deterministic) {  // gathered inputs, then direct's in-order fold over my block
    gather_inputs(session, pos, inst, me);
    const char* work = work_of(inst, me);
    psum_scatter_from(inst, me, out_shape,
                      [&](int64_t j) { return work + j * n * static_cast<int64_t>(elem); });
    return;
  }
  char* work = work_of(inst, me);
  const int64_t C = stage_scatter_chunks(inst, me, work);
  SlotTransport t(session, pos, inst, me);
  run_ring(t, RingPhase::reduce_scatter, Kind::psum, c.dtype, me, N, n, c.algo == Algo::bidi_ring,
           1, piece_bytes(inst, me));
  (void)sd;
  (void)out_shape;  // chunk `me` is the output, densely laid out
  plane_of(inst, me).copy(out_ptr(inst, me), work + me * C * static_cast<int64_t>(elem),
                          static_cast<size_t>(C) * elem);
}

void ring_all_gather(Session& session, int64_t pos, Instance& inst, int64_t me,
                     const Shape& out_shape) {
  const Call& c = inst.call();
  const int64_t N = inst.size(), C = count(c.shape);
  const size_t elem = dtype_size(c.dtype);
  char* work = work_of(inst, me);
  plane_of(inst, me).copy(work + me * C * static_cast<int64_t>(elem), inst.slot(me).in,
                          static_cast<size_t>(C) * elem);
  SlotTransport t(session, pos, inst, me);
  run_ring(t, RingPhase::all_gather, Kind::psum, c.dtype, me, N, N * C, c.algo == Algo::bidi_ring,
           1, piece_bytes(inst, me));
  if (work == out_ptr(inst, me)) return;  // gathering along axis 0: the work buffer is the output
  all_gather_from(inst, me, out_shape,
                  [&](int64_t j) { return work + j * C * static_cast<int64_t>(elem); });
}

// ---- native: the platform's collective library (NCCL), after the same rendezvous, so mismatched
// or missing calls are caught before the library is ever entered. Layout work (chunk staging,
// placing gathered blocks) is shared with the ring forms.
std::vector<int> group_devices(const Instance& inst) {
  std::vector<int> g(static_cast<size_t>(inst.size()));
  for (int64_t j = 0; j < inst.size(); ++j) g[static_cast<size_t>(j)] = inst.slot(j).device;
  return g;
}

// Every member has launched its part of the library call, so waiting for the stream cannot hang
// on a peer that is itself waiting elsewhere (asynchronous collectives waited in different orders
// on different devices): that shows up here, in the host's wait-for graph, as an error.
void await_launches(Session& session, int64_t pos, Instance& inst, int64_t me) {
  inst.advance(me, 1);
  for (int64_t j = 0; j < inst.size(); ++j) {
    if (j != me) session.wait_progress(pos, inst, j, 1);
  }
}

void native_collective(Session& session, int64_t pos, Instance& inst, int64_t me,
                       const Shape& out_shape) {
  const Call& c = inst.call();
  const Plane pl = plane_of(inst, me);
  backend::NativeComm& nc = pl.native_comm();
  const std::vector<int> group = group_devices(inst);
  const int dev = pl.device();
  const int64_t N = inst.size(), n = count(c.shape);
  const auto elem = static_cast<int64_t>(dtype_size(c.dtype));
  const char* in = in_ptr(inst, me);
  char* out = out_ptr(inst, me);
  char* work = work_of(inst, me);
  auto gathered = [&](int64_t j) { return work + j * n * elem; };
  switch (c.kind) {
    case Kind::psum:
    case Kind::pmean:
    case Kind::pmax:
    case Kind::pmin:
      if (c.deterministic) {  // every input, then the in-order fold: direct's bits
        nc.all_gather(dev, group, in, work, n * elem);
        await_launches(session, pos, inst, me);
        std::vector<const void*> srcs;
        for (int64_t j = 0; j < N; ++j) srcs.push_back(gathered(j));
        pl.fold(c.kind, c.dtype, out_dtype(c), out, srcs, n);
      } else if (c.kind == Kind::pmean) {
        nc.all_reduce(dev, group, backend::FoldOp::sum, c.dtype, in, work, n);
        await_launches(session, pos, inst, me);
        pl.mean_from_sum(c.dtype, out_dtype(c), out, work, n, N);
      } else {
        nc.all_reduce(dev, group, fold_op(c.kind), c.dtype, in, out, n);
        await_launches(session, pos, inst, me);
      }
      break;
    case Kind::all_gather:
      nc.all_gather(dev, group, in, work, n * elem);  // work is the output for axis 0
      await_launches(session, pos, inst, me);
      if (work != out) all_gather_from(inst, me, out_shape, gathered);
      break;
    case Kind::psum_scatter:
      if (c.deterministic) {
        nc.all_gather(dev, group, in, work, n * elem);
        await_launches(session, pos, inst, me);
        psum_scatter_from(inst, me, out_shape, gathered);
      } else {
        const int64_t C = stage_scatter_chunks(inst, me, work);
        nc.reduce_scatter(dev, group, c.dtype, work, out, C);
        await_launches(session, pos, inst, me);
      }
      break;
    case Kind::ppermute: {
      std::vector<backend::NativeComm::Transfer> sends, recvs;
      bool receives = false;
      for (auto [s, d] : c.perm) {
        if (s == me && d == me) {
          pl.copy(out, in, static_cast<size_t>(n * elem));
          receives = true;
        } else if (s == me) {
          sends.push_back({d, const_cast<char*>(in), n * elem});
        } else if (d == me) {
          recvs.push_back({s, out, n * elem});
          receives = true;
        }
      }
      if (!receives) pl.zero(out, static_cast<size_t>(n * elem));
      nc.send_recv(dev, group, sends, recvs);
      await_launches(session, pos, inst, me);
      break;
    }
    case Kind::all_to_all: {
      // Stage the piece for each member densely, exchange, place what arrived.
      const A2APieces pieces(c, out_shape, N);
      const int64_t P = count(pieces.extent);
      const core::View dense{0, core::dense_strides(pieces.extent)};
      char* send = work;
      char* recv = work + N * P * elem;
      std::vector<backend::NativeComm::Transfer> sends, recvs;
      for (int64_t j = 0; j < N; ++j) {
        copy_view(pl, send + j * P * elem, dense, in, pieces.src(j), pieces.extent,
                  static_cast<size_t>(elem));
        sends.push_back({j, send + j * P * elem, P * elem});
        recvs.push_back({j, recv + j * P * elem, P * elem});
      }
      nc.send_recv(dev, group, sends, recvs);
      await_launches(session, pos, inst, me);
      for (int64_t j = 0; j < N; ++j) {
        copy_view(pl, out, pieces.dst(j), recv + j * P * elem, dense, pieces.extent,
                  static_cast<size_t>(elem));
      }
      break;
    }
  }
}

}  // namespace

int64_t work_bytes(const Call& c, int64_t n) {
  if (c.algo == Algo::direct) return 0;
  const int64_t bytes = count(c.shape) * static_cast<int64_t>(dtype_size(c.dtype));
  const bool reduction = c.kind == Kind::psum || c.kind == Kind::pmean || c.kind == Kind::pmax ||
                         c.kind == Kind::pmin || c.kind == Kind::psum_scatter;
  if (c.deterministic && reduction) return n * bytes;  // every member's input, gathered
  switch (c.kind) {
    case Kind::pmean:
      return bytes;  // the ring sums in the input dtype
    case Kind::psum_scatter:
      return bytes;
    case Kind::all_gather:
      return c.axis == 0 ? 0 : n * bytes;
    case Kind::all_to_all:
      return c.algo == Algo::native ? 2 * bytes : 0;  // send and receive staging
    default:
      return 0;
  }
}

Pending start(Session& session, int64_t pos, const GroupLayout& layout, const Call& call, Slot slot,
              std::vector<int64_t> out_shape) {
  Pending p;
  p.session_ = &session;
  p.pos_ = pos;
  p.index_ = layout.index_of[static_cast<size_t>(pos)];
  p.out_shape_ = std::move(out_shape);
  const Plane pl(slot.backend, slot.device);
  pl.begin();  // the input is complete before any peer may read it
  Session::Arrival a = session.arrive(pos, layout, call, std::move(slot));
  p.inst_ = std::move(a.instance);
  if (a.completed) {
    const int64_t bytes = count(call.shape) * static_cast<int64_t>(dtype_size(call.dtype));
    if (call.algo == Algo::direct && is_reduction(call.kind) && bytes <= kSmallReduceBytes &&
        pl.direct_ok(*p.inst_))  // else finish() says why direct cannot serve the group
      reduce_small(*p.inst_, pl);
    session.publish(*p.inst_);
  }
  return p;
}

void finish(Pending& p) {
  Instance& inst = *p.inst_;
  p.session_->wait_ready(p.pos_, inst);
  const Call& c = inst.call();
  const int64_t me = p.index_;
  const bool ring = c.algo == Algo::ring || c.algo == Algo::bidi_ring;
  if (c.algo == Algo::native) {
    native_collective(*p.session_, p.pos_, inst, me, p.out_shape_);
    plane_of(inst, me).fence();
    p.inst_.reset();
    return;
  }
  plane_of(inst, me).require_direct(inst);  // GPUs without peer access: an error, not a fault
  switch (c.kind) {
    case Kind::psum:
    case Kind::pmean:
    case Kind::pmax:
    case Kind::pmin:
      if (ring)
        ring_reduce(*p.session_, p.pos_, inst, me);
      else if (count(c.shape) * static_cast<int64_t>(dtype_size(c.dtype)) > kSmallReduceBytes)
        reduce_large(inst, me);
      break;
    case Kind::all_gather:
      if (ring)
        ring_all_gather(*p.session_, p.pos_, inst, me, p.out_shape_);
      else
        all_gather(inst, me, p.out_shape_);
      break;
    case Kind::psum_scatter:
      if (ring)
        ring_psum_scatter(*p.session_, p.pos_, inst, me, p.out_shape_);
      else
        psum_scatter(inst, me, p.out_shape_);
      break;
    case Kind::ppermute:
      ppermute(inst, me);
      break;
    case Kind::all_to_all:
      all_to_all(inst, me, p.out_shape_, ring);
      break;
  }
  plane_of(inst, me).fence();  // the output is complete, and peers' inputs are no longer read
  p.inst_.reset();
}

}  // namespace meshrt::coll
