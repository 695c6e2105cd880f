// runtime/random.h: JAX's threefry2x32 PRNG, bit for bit, in both of JAX's bit streams.
//
//   random::Key k = random::key(0);                          // jax.random.key(0)
//   auto [k1, k2] = std::pair{random::split(k)[0], random::split(k)[1]};
//   Tensor w = random::normal(k1, {784, 128}, dev);          // jax.random.normal(k1, (784, 128))
//
// Stream::current is JAX >= 0.5 (jax_threefry_partitionable=True): element i of a draw depends
// only on i. Stream::legacy is JAX 0.4.x, where values depend on the total size. Values are
// computed on the host and are identical on every platform and for every sharding.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/array.h"
#include "runtime/tensor.h"

namespace meshrt::random {

enum class Stream { current, legacy };

// A threefry2x32 key: two 32-bit words (JAX's key data) and the stream it draws with.
class Key {
 public:
  Key() = default;
  Key(uint32_t hi, uint32_t lo, Stream stream) : hi_(hi), lo_(lo), stream_(stream) {}
  uint32_t hi() const { return hi_; }
  uint32_t lo() const { return lo_; }
  Stream stream() const { return stream_; }
  friend bool operator==(const Key&, const Key&) = default;

 private:
  uint32_t hi_ = 0, lo_ = 0;
  Stream stream_ = Stream::current;
};

// jax.random.key(seed) with 64-bit types on: [seed >> 32, seed & 0xFFFFFFFF] (seeds below 2^32
// give [0, seed], as JAX does by default).
Key key(uint64_t seed, Stream stream = Stream::current);
std::vector<Key> split(const Key& key, int num = 2);
Key fold_in(const Key& key, uint32_t data);

// jax.random.bits: 32-bit words, row-major over shape.
std::vector<uint32_t> bits(const Key& key, const Shape& shape);
// Host values of jax.random.uniform / normal (float32 or float64).
std::vector<double> uniform_values(const Key& key, const Shape& shape, DType dtype,
                                   double minval = 0.0, double maxval = 1.0);
std::vector<double> normal_values(const Key& key, const Shape& shape, DType dtype);

Tensor uniform(const Key& key, Shape shape, Device device, DType dtype = DType::f32,
               double minval = 0.0, double maxval = 1.0);
Tensor normal(const Key& key, Shape shape, Device device, DType dtype = DType::f32);
// The same global values as the unsharded draw, placed by `sharding`.
Array normal(const Key& key, Shape shape, const Sharding& sharding, DType dtype = DType::f32);
Array uniform(const Key& key, Shape shape, const Sharding& sharding, DType dtype = DType::f32,
              double minval = 0.0, double maxval = 1.0);

// The threefry2x32 block cipher (20 rounds) on one counter pair: exposed for tests.
std::pair<uint32_t, uint32_t> threefry2x32(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1);

}  // namespace meshrt::random
