#include "collectives/native.h"

#include <vector>

#include "backends/native_comm.h"
#include "collectives/cross.h"
#include "collectives/pieces.h"
#include "core/error.h"

namespace meshrt::coll {

namespace {

// Progress unit a member publishes once its library call is launched.
constexpr uint32_t kLaunched = 1;

// What every step needs: member `me`'s buffers, its backend and the group's devices.
struct Member {
  Member(Session& s, int64_t p, Instance& i, int64_t m)
      : session(s),
        pos(p),
        inst(i),
        me(m),
        call(i.call()),
        pl(plane_of(i, m)),
        nc(pl.native_comm()),
        dev(pl.device()),
        n(count(call.shape)),
        elem(static_cast<int64_t>(dtype_size(call.dtype))),
        in(in_ptr(i, m)),
        out(out_ptr(i, m)),
        work(work_of(i, m)),
        group(i.spans_processes() ? spanning_group(i) : local_group(i)) {}

  static backend::CommGroup local_group(const Instance& inst) {
    backend::CommGroup g;
    g.devices.resize(static_cast<size_t>(inst.size()));
    for (int64_t j = 0; j < inst.size(); ++j)
      g.devices[static_cast<size_t>(j)] = inst.slot(j).device;
    return g;
  }

  // Every member has launched its part of the library call, so waiting for the stream cannot
  // hang on a peer that is itself waiting elsewhere (asynchronous collectives waited in different
  // orders on different devices): that shows up here, in the host's wait-for graph, as an error.
  // Members in other processes are not seen here; the agreement across processes came first.
  void await_launches() const {
    inst.advance(me, kLaunched);
    for (int64_t j = 0; j < inst.size(); ++j) {
      if (j != me && inst.slot(j).backend != nullptr)
        session.wait_progress(pos, inst, j, kLaunched);
    }
  }

  Session& session;
  int64_t pos;
  Instance& inst;
  int64_t me;
  const Call& call;
  Plane pl;
  backend::NativeComm& nc;
  int dev;
  int64_t n, elem;  // input elements, element bytes
  const char* in;
  char* out;
  char* work;
  backend::CommGroup group;  // the members (with their processes when the group spans several)
};

// Every member's input into the work buffer, block j = member j's (the deterministic forms).
void gather_inputs(const Member& m) {
  m.nc.all_gather(m.dev, m.group, m.in, m.work, m.n * m.elem);
  m.await_launches();
}

// psum/pmean/pmax/pmin. Deterministic: the gathered inputs folded in group-index order (direct's
// bits); pmean: the library sums in the input dtype, the divide follows.
void reduce(const Member& m) {
  const Call& c = m.call;
  if (c.deterministic) {
    gather_inputs(m);
    fold_inputs(m.inst, m.me, Inputs(m.inst, m.work));
  } else if (c.kind == Kind::pmean) {
    m.nc.all_reduce(m.dev, m.group, backend::FoldOp::sum, c.dtype, m.in, m.work, m.n);
    m.await_launches();
    m.pl.mean_from_sum(c.dtype, out_dtype(c), m.out, m.work, m.n, m.inst.size());
  } else {
    m.nc.all_reduce(m.dev, m.group, fold_op(c.kind), c.dtype, m.in, m.out, m.n);
    m.await_launches();
  }
}

void all_gather(const Member& m, const Shape& out_shape) {
  gather_inputs(m);  // the work buffer is the output for axis 0
  if (m.work != m.out) place_gathered(m.inst, m.me, out_shape, Inputs(m.inst, m.work));
}

// Deterministic: the gathered inputs, then direct's in-order fold of my block; else the library
// reduce-scatters the input staged chunk-major.
void psum_scatter(const Member& m, const Shape& out_shape) {
  if (m.call.deterministic) {
    gather_inputs(m);
    fold_own_block(m.inst, m.me, out_shape, Inputs(m.inst, m.work));
    return;
  }
  const int64_t C = stage_scatter_chunks(m.inst, m.me, m.work);
  m.nc.reduce_scatter(m.dev, m.group, m.call.dtype, m.work, m.out, C);
  m.await_launches();
}

// Sends to every pair's destination, receives from its source; a member no pair names gets zeros.
void ppermute(const Member& m) {
  const int64_t bytes = m.n * m.elem;
  std::vector<backend::NativeComm::Transfer> sends, recvs;
  bool receives = false;
  for (auto [s, d] : m.call.perm) {
    if (s == m.me && d == m.me) {
      m.pl.copy(m.out, m.in, static_cast<size_t>(bytes));
      receives = true;
    } else if (s == m.me) {
      sends.push_back({d, const_cast<char*>(m.in), bytes});
    } else if (d == m.me) {
      recvs.push_back({s, m.out, bytes});
      receives = true;
    }
  }
  if (!receives) m.pl.zero(m.out, static_cast<size_t>(bytes));
  m.nc.send_recv(m.dev, m.group, sends, recvs);
  m.await_launches();
}

// Stages the piece for each member densely, exchanges them, places what arrived.
void all_to_all(const Member& m, const Shape& out_shape) {
  const int64_t N = m.inst.size();
  const A2APieces pieces(m.call, out_shape, N);
  const int64_t P = count(pieces.extent) * m.elem;  // bytes per piece
  const core::View dense{0, core::dense_strides(pieces.extent)};
  const auto elem = static_cast<size_t>(m.elem);
  char* send = m.work;
  char* recv = m.work + N * P;
  std::vector<backend::NativeComm::Transfer> sends, recvs;
  for (int64_t j = 0; j < N; ++j) {
    copy_view(m.pl, send + j * P, dense, m.in, pieces.src(j), pieces.extent, elem);
    sends.push_back({j, send + j * P, P});
    recvs.push_back({j, recv + j * P, P});
  }
  m.nc.send_recv(m.dev, m.group, sends, recvs);
  m.await_launches();
  for (int64_t j = 0; j < N; ++j)
    copy_view(m.pl, m.out, pieces.dst(j), recv + j * P, dense, pieces.extent, elem);
}

}  // namespace

void native_collective(Session& session, int64_t pos, Instance& inst, int64_t me,
                       const Shape& out_shape) {
  // bf16/f16 go to the library as its own 16-bit types (NCCL: ncclBfloat16, ncclFloat16). Its ring
  // reductions round to 16 bits at every step, where direct rounds once; deterministic calls
  // gather and fold as direct does, so they give direct's bits.
  const Member m(session, pos, inst, me);
  switch (m.call.kind) {
    case Kind::psum:
    case Kind::pmean:
    case Kind::pmax:
    case Kind::pmin:
      reduce(m);
      break;
    case Kind::all_gather:
      all_gather(m, out_shape);
      break;
    case Kind::psum_scatter:
      psum_scatter(m, out_shape);
      break;
    case Kind::ppermute:
      ppermute(m);
      break;
    case Kind::all_to_all:
      all_to_all(m, out_shape);
      break;
  }
}

bool native_launch_unjoined(Instance& inst, int64_t me) {
  if (inst.progress(me).load(std::memory_order_acquire) < kLaunched) return false;
  for (int64_t j = 0; j < inst.size(); ++j) {
    if (inst.progress(j).load(std::memory_order_acquire) < kLaunched) return true;
  }
  return false;
}

}  // namespace meshrt::coll
