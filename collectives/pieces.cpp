#include "collectives/pieces.h"

namespace meshrt::coll {

namespace {

// Inserts a dimension with `stride` at `at` into a view.
core::View insert_dim(core::View v, size_t at, int64_t stride) {
  v.strides.insert(v.strides.begin() + static_cast<std::ptrdiff_t>(at), stride);
  return v;
}

}  // namespace

void copy_view(const Plane& pl, char* dst, const core::View& dv, const char* src,
               const core::View& sv, const Shape& extent, size_t elem) {
  const auto e = static_cast<int64_t>(elem);
  core::for_each_runs(extent, {&dv, &sv}, [&](const core::Runs& r) {
    pl.copy_2d(dst + r.offsets[0] * e, static_cast<size_t>(r.pitches[0] * e),
               src + r.offsets[1] * e, static_cast<size_t>(r.pitches[1] * e),
               static_cast<size_t>(r.run * e), static_cast<size_t>(r.rows));
  });
}

void place_gathered(const Instance& inst, int64_t me, const Shape& out_shape,
                    const Inputs& inputs) {
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
    copy_view(plane_of(inst, me), out_ptr(inst, me), core::box_view(out_shape, start), inputs(j),
              src, extent, elem);
  }
}

void fold_own_block(const Instance& inst, int64_t me, const Shape& out_shape,
                    const Inputs& inputs) {
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
    for (int64_t j = 0; j < N; ++j) srcs[static_cast<size_t>(j)] = inputs(j) + r.offsets[1] * e;
    pl.fold_rows(Kind::psum, c.dtype, out + r.offsets[0] * e, r.pitches[0], srcs, r.pitches[1],
                 r.run, r.rows);
  });
}

void fold_inputs(const Instance& inst, int64_t me, const Inputs& inputs) {
  const Call& c = inst.call();
  std::vector<const void*> srcs(static_cast<size_t>(inst.size()));
  for (int64_t j = 0; j < inst.size(); ++j) srcs[static_cast<size_t>(j)] = inputs(j);
  plane_of(inst, me).fold(c.kind, c.dtype, out_dtype(c), out_ptr(inst, me), srcs, count(c.shape));
}

void stage_own_input(const Instance& inst, int64_t me, char* work) {
  const int64_t bytes = input_bytes(inst.call());
  plane_of(inst, me).copy(work + me * bytes, in_ptr(inst, me), static_cast<size_t>(bytes));
}

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

A2APieces::A2APieces(const Call& c, const Shape& out_shape, int64_t n) : call(c), out(out_shape) {
  const auto split = static_cast<size_t>(c.axis);
  extent = c.shape;
  if (c.tiled)
    extent[split] = c.shape[split] / n;
  else
    extent.erase(extent.begin() + static_cast<std::ptrdiff_t>(split));
}

core::View A2APieces::src(int64_t to) const {
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

core::View A2APieces::dst(int64_t from) const {
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

}  // namespace meshrt::coll
