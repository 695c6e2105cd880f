// collectives/fingerprint.h: what one device asked a collective to do: its fingerprint.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/algo.h"
#include "core/dtype.h"

namespace meshrt::coll {

enum class Kind { psum, pmean, pmax, pmin, all_gather, psum_scatter, ppermute, all_to_all };

std::string_view kind_name(Kind k);

// Every participant of one rendezvous must present an equal Call.
struct Call {
  Kind kind = Kind::psum;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  // The group layout's names: one interned vector per axes tuple and launch, so comparing the
  // pointer compares the axes.
  const std::vector<std::string>* axes = nullptr;
  int64_t axis = 0;   // all_gather axis, psum_scatter dimension, all_to_all split_axis
  int64_t axis2 = 0;  // all_to_all concat_axis
  bool tiled = false;
  std::vector<std::pair<int64_t, int64_t>> perm;  // ppermute (src, dst), normalised
  Algo algo = Algo::direct;                       // resolved: never automatic (collectives/algo.h)
  // Reductions fold in group-index order whatever the algorithm (same bits as direct).
  bool deterministic = false;

  // "psum(float32[4,2], axes=('x',))", "all_gather(float32[2], axes=('x', 'y'), axis=0,
  // tiled=True)".
  std::string str() const;
  friend bool operator==(const Call&, const Call&) = default;
};

}  // namespace meshrt::coll
