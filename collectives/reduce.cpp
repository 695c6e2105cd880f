#include "collectives/reduce.h"

namespace meshrt::coll {

DType pmean_dtype(DType in) {
  switch (in) {
    case DType::i32:
      return DType::f32;
    case DType::i64:
      return DType::f64;
    default:
      return in;
  }
}

}  // namespace meshrt::coll
