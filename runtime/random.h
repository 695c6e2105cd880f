// runtime/random.h: JAX's threefry2x32 PRNG, bit for bit, in both of JAX's bit streams.
//
//   random::Key k = random::key(0);                          // jax.random.key(0)
//   auto [k1, k2] = std::pair{random::split(k)[0], random::split(k)[1]};
//   Tensor w = random::normal(k1, {784, 128}, dev);          // jax.random.normal(k1, (784, 128))
//
// Stream::current is JAX >= 0.5 (jax_threefry_partitionable=True): element i of a draw depends
// only on i. Stream::legacy is JAX 0.4.x, where values depend on the total size. Values are
// computed on the host and are identical on every platform and for every sharding.
//
// A key carries its stream; key(seed) without one takes the process default, so code that
// reproduces a JAX 0.4 notebook sets it once:
//   random::set_default_stream(random::Stream::legacy);  // or MESHRT_PRNG_STREAM=legacy
//   Key k = random::key(0);                               // legacy
//   Key c = random::key(0, random::Stream::current);      // an explicit stream always wins
//
// Errors name the function called: "[random.normal] dtype must be ...".
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/array.h"
#include "runtime/tensor.h"

namespace meshrt::random {

// Which of JAX's two bit streams a key draws with (the file comment has the difference).
enum class Stream {
  current,  // JAX >= 0.5, jax_threefry_partitionable=True
  legacy,   // JAX 0.4.x
};

// A threefry2x32 key: two 32-bit words (JAX's key data) and the stream it draws with.
class Key {
 public:
  // The key [0, 0] in Stream::current.
  Key() = default;
  // The key with data [hi, lo] (jax.random.wrap_key_data) drawing with `stream`.
  Key(uint32_t hi, uint32_t lo, Stream stream) : hi_(hi), lo_(lo), stream_(stream) {}
  // The first key word (jax.random.key_data(k)[0]).
  uint32_t hi() const { return hi_; }
  // The second key word (jax.random.key_data(k)[1]).
  uint32_t lo() const { return lo_; }
  // The stream this key draws with.
  Stream stream() const { return stream_; }
  // Same words and same stream.
  friend bool operator==(const Key&, const Key&) = default;

 private:
  uint32_t hi_ = 0, lo_ = 0;
  Stream stream_ = Stream::current;
};

// The stream key(seed) uses: the last set_default_stream(s), else MESHRT_PRNG_STREAM (current or
// legacy; a malformed value is an Error naming it), else Stream::current.
// set_default_stream(std::nullopt) goes back to the environment. Thread-safe.
void set_default_stream(std::optional<Stream> stream);
// The stream key(seed) uses now (see set_default_stream). Thread-safe.
Stream default_stream();

// jax.random.key(seed) with 64-bit types on: [seed >> 32, seed & 0xFFFFFFFF] (seeds below 2^32
// give [0, seed], as JAX does by default). The contract's `key(seed, Stream stream =
// Stream::current)` is these two overloads: with a stream, that stream; without, default_stream()
// (Stream::current unless the program or MESHRT_PRNG_STREAM chose otherwise).
Key key(uint64_t seed);
// jax.random.key(seed) drawing with `stream`.
Key key(uint64_t seed, Stream stream);
// jax.random.split(key, num): `num` new independent keys in the key's stream; num < 0 is an Error.
std::vector<Key> split(const Key& key, int num = 2);
// jax.random.fold_in(key, data): a new key mixing `data` into `key` (same stream).
Key fold_in(const Key& key, uint32_t data);

// jax.random.bits: 32-bit words, row-major over shape.
std::vector<uint32_t> bits(const Key& key, const Shape& shape);
// Host values of jax.random.uniform / normal (float32 or float64).
std::vector<double> uniform_values(const Key& key, const Shape& shape, DType dtype,
                                   double minval = 0.0, double maxval = 1.0);
// Host values of jax.random.normal (float32 or float64), row-major over shape.
std::vector<double> normal_values(const Key& key, const Shape& shape, DType dtype);
// Host values of jax.random.randint (int32 or int64), bernoulli (p as float32 or float64) and
// permutation (0..n-1 shuffled).
std::vector<int64_t> randint_values(const Key& key, const Shape& shape, int64_t minval,
                                    int64_t maxval, DType dtype = DType::i32);
// Host values of jax.random.bernoulli(key, p, shape), drawn in p_dtype.
std::vector<bool> bernoulli_values(const Key& key, double p, const Shape& shape,
                                   DType p_dtype = DType::f32);
// Host values of jax.random.permutation(key, n).
std::vector<int64_t> permutation_values(const Key& key, int64_t n);

// jax.random.uniform(key, shape, dtype, minval, maxval) on `device`: values in [minval, maxval);
// dtype is float32 or float64.
Tensor uniform(const Key& key, Shape shape, Device device, DType dtype = DType::f32,
               double minval = 0.0, double maxval = 1.0);
// jax.random.normal(key, shape, dtype) on `device`; dtype is float32 or float64.
Tensor normal(const Key& key, Shape shape, Device device, DType dtype = DType::f32);
// The same global values as the unsharded draw, placed by `sharding`.
Array normal(const Key& key, Shape shape, const Sharding& sharding, DType dtype = DType::f32);
// The same global values as the unsharded uniform draw, placed by `sharding`.
Array uniform(const Key& key, Shape shape, const Sharding& sharding, DType dtype = DType::f32,
              double minval = 0.0, double maxval = 1.0);

// jax.random.randint(key, shape, minval, maxval, dtype): integers in [minval, maxval), bit for bit
// (JAX's modulus of two draws, bounds clipped to dtype as JAX clips them; maxval <= minval gives
// minval). dtype is int32 or int64.
Tensor randint(const Key& key, Shape shape, int64_t minval, int64_t maxval, Device device,
               DType dtype = DType::i32);
// The same global values as the unsharded randint draw, placed by `sharding`.
Array randint(const Key& key, Shape shape, int64_t minval, int64_t maxval, const Sharding& sharding,
              DType dtype = DType::i32);
// jax.random.bernoulli(key, p, shape): bool, uniform(key, shape, p_dtype) < p. JAX draws in p's
// dtype: float32 is JAX's default (and jnp.float32(p) under x64); pass DType::f64 to match a
// Python float p under jax_enable_x64.
Tensor bernoulli(const Key& key, double p, Shape shape, Device device, DType p_dtype = DType::f32);
// The same global values as the unsharded bernoulli draw, placed by `sharding`.
Array bernoulli(const Key& key, double p, Shape shape, const Sharding& sharding,
                DType p_dtype = DType::f32);
// jax.random.permutation(key, n): 0..n-1 in JAX's shuffled order (its rounds of stable sorts by
// fresh 32-bit keys). dtype is int32 or int64 (JAX's int64 under x64; the values are the same).
Tensor permutation(const Key& key, int64_t n, Device device, DType dtype = DType::i32);
// The same values as the unsharded permutation, placed by `sharding` (a 1-D sharding).
Array permutation(const Key& key, int64_t n, const Sharding& sharding, DType dtype = DType::i32);

// The threefry2x32 block cipher (20 rounds) on one counter pair: exposed for tests.
std::pair<uint32_t, uint32_t> threefry2x32(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1);

}  // namespace meshrt::random
