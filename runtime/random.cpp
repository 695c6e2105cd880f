// threefry2x32 and JAX's use of it (jax/_src/prng.py, random.py): key derivation, split and
// fold_in, and the bits-to-float conversions of uniform and normal, so values equal JAX's.
#include "runtime/random.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/sharding_impl.h"

namespace meshrt::random {

namespace {

inline uint32_t rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }

// `api` is what the user called ("random.normal"): every error names it.
int64_t checked_size(const Shape& shape, const char* api) {
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(detail::cat("[", api, "] shape ", shape_str(shape),
                              " has a negative dimension; dimensions must be >= 0"));
    }
  }
  return shape_size(shape);
}

// JAX's original threefry_2x32(key, count): counters split in halves (x0 = first half, x1 =
// second half, padded with a 0 when odd), outputs concatenated (y0 then y1).
std::vector<uint32_t> threefry_counts(const Key& k, const std::vector<uint32_t>& count) {
  const size_t n = count.size(), h = (n + 1) / 2;
  std::vector<uint32_t> out(2 * h);
  for (size_t i = 0; i < h; ++i) {
    const uint32_t x1 = h + i < n ? count[h + i] : 0;
    auto [y0, y1] = threefry2x32(k.hi(), k.lo(), count[i], x1);
    out[i] = y0;
    out[h + i] = y1;
  }
  out.resize(n);
  return out;
}

std::vector<uint32_t> iota32(size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i);
  return v;
}

// 64-bit words for float64 draws.
std::vector<uint64_t> bits64(const Key& k, int64_t size) {
  std::vector<uint64_t> out(static_cast<size_t>(size));
  if (k.stream() == Stream::current) {
    for (int64_t i = 0; i < size; ++i) {
      auto [y0, y1] =
          threefry2x32(k.hi(), k.lo(), static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32),
                       static_cast<uint32_t>(i));
      out[static_cast<size_t>(i)] = (static_cast<uint64_t>(y0) << 32) | y1;
    }
  } else {
    std::vector<uint32_t> w = threefry_counts(k, iota32(static_cast<size_t>(2 * size)));
    for (int64_t i = 0; i < size; ++i) {
      out[static_cast<size_t>(i)] = (static_cast<uint64_t>(w[static_cast<size_t>(i)]) << 32) |
                                    w[static_cast<size_t>(size + i)];
    }
  }
  return out;
}

// XLA's erfInv32 (M. Giles' single-precision polynomial), every step in float, as JAX computes it.
float erf_inv32(float x) {
  static const float lt5[9] = {2.81022636e-08f,  3.43273939e-07f, -3.5233877e-06f,
                               -4.39150654e-06f, 0.00021858087f,  -0.00125372503f,
                               -0.00417768164f,  0.246640727f,    1.50140941f};
  static const float ge5[9] = {-0.000200214257f, 0.000100950558f, 0.00134934322f,
                               -0.00367342844f,  0.00573950773f,  -0.0076224613f,
                               0.00943887047f,   1.00167406f,     2.83297682f};
  volatile float xx =
      x * (-x);  // kept in float: the rounding of x*x near 1 is part of JAX's result
  float w = -std::log1p(static_cast<float>(xx));
  const bool lt = w < 5.0f;
  w = lt ? w - 2.5f : std::sqrt(w) - 3.0f;
  const float* c = lt ? lt5 : ge5;
  float p = c[0];
  for (int i = 1; i < 9; ++i) p = c[i] + p * w;
  if (std::fabs(x) == 1.0f) return x * std::numeric_limits<float>::infinity();
  return p * x;
}

// XLA's ErfInv64 (M. Giles' double-precision polynomials).
double erf_inv64(double x) {
  static const double a[23] = {
      -3.6444120640178196996e-21, -1.685059138182016589e-19,  1.2858480715256400167e-18,
      1.115787767802518096e-17,   -1.333171662854620906e-16,  2.0972767875968561637e-17,
      6.6376381343583238325e-15,  -4.0545662729752068639e-14, -8.1519341976054721522e-14,
      2.6335093153082322977e-12,  -1.2975133253453532498e-11, -5.4154120542946279317e-11,
      1.051212273321532285e-09,   -4.1126339803469836976e-09, -2.9070369957882005086e-08,
      4.2347877827932403518e-07,  -1.3654692000834678645e-06, -1.3882523362786468719e-05,
      0.0001867342080340571352,   -0.00074070253416626697512, -0.0060336708714301490533,
      0.24015818242558961693,     1.6536545626831027356};
  static const double b[19] = {
      2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
      1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
      2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
      6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
      0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
      -0.0037512085075692412107, 0.005370914553590063617,   1.0052589676941592334,
      3.0838856104922207635};
  static const double c[17] = {
      -2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
      -3.7894654401267369937e-09, 7.6157012080783393804e-09,  -1.4960026627149240478e-08,
      2.9147953450901080826e-08,  -6.7711997758452339498e-08, 2.2900482228026654717e-07,
      -9.9298272942317002539e-07, 4.5260625972231537039e-06,  -1.9681778105531670567e-05,
      7.5995277030017761139e-05,  -0.00021503011930044477347, -0.00013871931833623122026,
      1.0103004648645343977,      4.8499064014085844221};
  double w = -std::log1p(-x * x);
  double p;
  if (w < 6.25) {
    w -= 3.125;
    p = a[0];
    for (int i = 1; i < 23; ++i) p = std::fma(p, w, a[i]);  // XLA's CPU code fuses these
  } else if (w < 16.0) {
    w = std::sqrt(w) - 3.25;
    p = b[0];
    for (int i = 1; i < 19; ++i) p = std::fma(p, w, b[i]);
  } else {
    w = std::sqrt(w) - 5.0;
    p = c[0];
    for (int i = 1; i < 17; ++i) p = std::fma(p, w, c[i]);
  }
  if (std::fabs(x) == 1.0) return x * std::numeric_limits<double>::infinity();
  return p * x;
}

void check_float(DType dtype, const char* api, const char* what = "dtype") {
  if (!is_floating(dtype)) {
    throw Error(detail::cat("[", api, "] ", what,
                            " must be bfloat16, float16, float32 or float64, got ",
                            dtype_name(dtype)));
  }
}

void check_int(DType dtype, const char* api) {
  if (dtype != DType::i32 && dtype != DType::i64) {
    throw Error(detail::cat("[", api, "] dtype must be int32 or int64, got ", dtype_name(dtype)));
  }
}

// jax.random.bits without the shape check: 32-bit words of a draw of `size` elements.
std::vector<uint32_t> bits32(const Key& k, int64_t size) {
  if (k.stream() == Stream::legacy) return threefry_counts(k, iota32(static_cast<size_t>(size)));
  std::vector<uint32_t> out(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    auto [y0, y1] =
        threefry2x32(k.hi(), k.lo(), static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32),
                     static_cast<uint32_t>(i));
    out[static_cast<size_t>(i)] = y0 ^ y1;
  }
  return out;
}

// jax.random.uniform for bfloat16 / float16 (current stream; checked against JAX 0.10.2): the low
// 8 bits of each word for bf16 (JAX draws at least 8 bits: bf16 has 7 mantissa bits), the low 16
// for f16, as the mantissa of a value in [1, 2); then every step in H, rounded as XLA does.
template <class H>
std::vector<double> uniform_half(const Key& k, int64_t size, double minval, double maxval,
                                 const char* api) {
  if (k.stream() == Stream::legacy) {
    throw Error(detail::cat("[", api, "] bfloat16/float16 draws follow the current stream only; ",
                            "use random::key(seed) (Stream::current), or draw float32 and astype"));
  }
  constexpr bool bf = std::is_same_v<H, bfloat16>;
  constexpr uint32_t rng_bits = bf ? 8 : 16, nmant = bf ? 7 : 10;
  constexpr uint16_t one = bf ? 0x3F80 : 0x3C00;
  const std::vector<uint32_t> w = bits32(k, size);
  const H lo(static_cast<float>(minval)), hi(static_cast<float>(maxval));
  const H span = hi - lo;
  std::vector<double> out(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const uint32_t b = w[static_cast<size_t>(i)] & ((1u << rng_bits) - 1u);
    const H f = H::from_bits(static_cast<uint16_t>((b >> (rng_bits - nmant)) | one)) - H(1.0f);
    const H r = f * span + lo;
    out[static_cast<size_t>(i)] = static_cast<double>(r < lo ? lo : r);
  }
  return out;
}

std::vector<double> uniform_impl(const Key& k, const Shape& shape, DType dtype, double minval,
                                 double maxval, const char* api) {
  check_float(dtype, api);
  const int64_t size = checked_size(shape, api);
  if (dtype == DType::bf16) return uniform_half<bfloat16>(k, size, minval, maxval, api);
  if (dtype == DType::f16) return uniform_half<float16>(k, size, minval, maxval, api);
  std::vector<double> out(static_cast<size_t>(size));
  if (dtype == DType::f32) {
    const std::vector<uint32_t> w = bits32(k, size);
    const float lo = static_cast<float>(minval), hi = static_cast<float>(maxval);
    for (int64_t i = 0; i < size; ++i) {
      const uint32_t fb = (w[static_cast<size_t>(i)] >> 9) | 0x3F800000u;
      const float f = std::bit_cast<float>(fb) - 1.0f;
      // XLA's CPU backend contracts f * (hi - lo) + lo into one fused multiply-add.
      out[static_cast<size_t>(i)] = std::max(lo, std::fma(f, hi - lo, lo));
    }
  } else {
    const std::vector<uint64_t> w = bits64(k, size);
    for (int64_t i = 0; i < size; ++i) {
      const uint64_t fb = (w[static_cast<size_t>(i)] >> 12) | 0x3FF0000000000000ull;
      const double f = std::bit_cast<double>(fb) - 1.0;
      out[static_cast<size_t>(i)] = std::max(minval, std::fma(f, maxval - minval, minval));
    }
  }
  return out;
}

std::vector<double> normal_impl(const Key& k, const Shape& shape, DType dtype, const char* api) {
  check_float(dtype, api);
  // JAX: u = uniform(key, shape, lo = nextafter(-1, 0), hi = 1); z = sqrt(2) * erf_inv(u).
  if (is_half(dtype)) {
    // In H: erf_inv in float32 rounded to H, times sqrt(2) rounded to H, rounded again (XLA).
    auto run = [&](auto h) {
      using H = decltype(h);
      const H lo = H::from_bits(dtype == DType::bf16 ? 0xBF7F : 0xBBFF);  // nextafter(-1, 0)
      std::vector<double> u = uniform_impl(k, shape, dtype, static_cast<double>(lo), 1.0, api);
      const H sqrt2(std::sqrt(2.0f));
      for (double& v : u) v = static_cast<double>(H(erf_inv32(static_cast<float>(v))) * sqrt2);
      return u;
    };
    return dtype == DType::bf16 ? run(bfloat16{}) : run(float16{});
  }
  if (dtype == DType::f32) {
    const float lo = std::nextafter(-1.0f, 0.0f);
    std::vector<double> u = uniform_impl(k, shape, DType::f32, lo, 1.0, api);
    for (double& v : u)
      v = static_cast<double>(static_cast<float>(std::sqrt(2.0)) *
                              erf_inv32(static_cast<float>(v)));
    return u;
  }
  const double lo = std::nextafter(-1.0, 0.0);
  std::vector<double> u = uniform_impl(k, shape, DType::f64, lo, 1.0, api);
  for (double& v : u) v = std::sqrt(2.0) * erf_inv64(v);
  return u;
}

// XLA's unsigned remainder: x % 0 is x.
template <class U>
U rem(U x, U y) {
  return y == 0 ? x : x % y;
}

// jax.random._randint for one unsigned width U (uint32_t for int32, uint64_t for int64): two
// draws (higher and lower words) from split(key), reduced modulo the span.
template <class S, class U>
std::vector<int64_t> randint_impl(const Key& k, int64_t size, int64_t minval, int64_t maxval) {
  constexpr int64_t lo_limit = std::numeric_limits<S>::min(),
                    hi_limit = std::numeric_limits<S>::max();
  const bool maxval_out_of_range = maxval > hi_limit;
  const S lo = static_cast<S>(std::clamp(minval, lo_limit, hi_limit));
  const S hi = static_cast<S>(std::clamp(maxval, lo_limit, hi_limit));
  std::vector<Key> k12 = split(k, 2);
  std::vector<U> higher(static_cast<size_t>(size)), lower(static_cast<size_t>(size));
  if constexpr (sizeof(U) == 4) {
    std::vector<uint32_t> h = bits32(k12[0], size), l = bits32(k12[1], size);
    std::copy(h.begin(), h.end(), higher.begin());
    std::copy(l.begin(), l.end(), lower.begin());
  } else {
    higher = bits64(k12[0], size);
    lower = bits64(k12[1], size);
  }
  U span = static_cast<U>(static_cast<U>(hi) - static_cast<U>(lo));
  if (hi <= lo) span = 1;  // maxval <= minval gives minval
  if (maxval_out_of_range && hi > lo) span = static_cast<U>(span + 1);  // may wrap to 0
  constexpr U half = U(1) << (sizeof(U) * 4);                           // 2^(nbits / 2)
  U multiplier = rem<U>(half, span);
  multiplier = rem<U>(static_cast<U>(multiplier * multiplier), span);
  std::vector<int64_t> out(static_cast<size_t>(size));
  for (size_t i = 0; i < out.size(); ++i) {
    U offset = static_cast<U>(rem<U>(higher[i], span) * multiplier + rem<U>(lower[i], span));
    offset = rem<U>(offset, span);
    out[i] = static_cast<S>(static_cast<U>(static_cast<U>(lo) + offset));
  }
  return out;
}

}  // namespace

std::pair<uint32_t, uint32_t> threefry2x32(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1) {
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  static const int r0[4] = {13, 15, 26, 6}, r1[4] = {17, 29, 16, 24};
  x0 += ks[0];
  x1 += ks[1];
  for (int i = 0; i < 5; ++i) {
    const int* r = (i % 2 == 0) ? r0 : r1;
    for (int j = 0; j < 4; ++j) {
      x0 += x1;
      x1 = rotl(x1, r[j]);
      x1 ^= x0;
    }
    x0 += ks[(i + 1) % 3];
    x1 += ks[(i + 2) % 3] + static_cast<uint32_t>(i + 1);
  }
  return {x0, x1};
}

namespace {
// -1: not set (MESHRT_PRNG_STREAM decides); else a Stream's value.
std::atomic<int> g_default_stream{-1};
}  // namespace

void set_default_stream(std::optional<Stream> stream) {
  g_default_stream.store(stream ? static_cast<int>(*stream) : -1);
}

Stream default_stream() {
  const int s = g_default_stream.load();
  if (s >= 0) return static_cast<Stream>(s);
  return config::prng_legacy_stream() ? Stream::legacy : Stream::current;
}

Key key(uint64_t seed) { return key(seed, default_stream()); }

Key key(uint64_t seed, Stream stream) {
  return Key(static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(seed), stream);
}

std::vector<Key> split(const Key& k, int num) {
  if (num < 0)
    throw Error(detail::cat("[random.split] num = ", num, " is negative; pass num >= 0"));
  std::vector<Key> out;
  if (k.stream() == Stream::current) {
    for (int i = 0; i < num; ++i) {
      auto [y0, y1] = threefry2x32(k.hi(), k.lo(), 0, static_cast<uint32_t>(i));
      out.emplace_back(y0, y1, k.stream());
    }
  } else {
    std::vector<uint32_t> w = threefry_counts(k, iota32(static_cast<size_t>(2 * num)));
    for (int i = 0; i < num; ++i)
      out.emplace_back(w[static_cast<size_t>(2 * i)], w[static_cast<size_t>(2 * i + 1)],
                       k.stream());
  }
  return out;
}

Key fold_in(const Key& k, uint32_t data) {
  auto [y0, y1] = threefry2x32(k.hi(), k.lo(), 0, data);
  return Key(y0, y1, k.stream());
}

std::vector<uint32_t> bits(const Key& k, const Shape& shape) {
  return bits32(k, checked_size(shape, "random.bits"));
}

std::vector<double> uniform_values(const Key& k, const Shape& shape, DType dtype, double minval,
                                   double maxval) {
  return uniform_impl(k, shape, dtype, minval, maxval, "random.uniform");
}

std::vector<double> normal_values(const Key& k, const Shape& shape, DType dtype) {
  return normal_impl(k, shape, dtype, "random.normal");
}

std::vector<int64_t> randint_values(const Key& k, const Shape& shape, int64_t minval,
                                    int64_t maxval, DType dtype) {
  check_int(dtype, "random.randint");
  const int64_t size = checked_size(shape, "random.randint");
  return dtype == DType::i32 ? randint_impl<int32_t, uint32_t>(k, size, minval, maxval)
                             : randint_impl<int64_t, uint64_t>(k, size, minval, maxval);
}

std::vector<bool> bernoulli_values(const Key& k, double p, const Shape& shape, DType p_dtype) {
  check_float(p_dtype, "random.bernoulli", "the dtype of p");
  // JAX: uniform(key, shape, p.dtype) < p, compared in p's dtype.
  const std::vector<double> u = uniform_impl(k, shape, p_dtype, 0.0, 1.0, "random.bernoulli");
  const double pp = p_dtype == DType::f32    ? static_cast<double>(static_cast<float>(p))
                    : p_dtype == DType::bf16 ? static_cast<double>(bfloat16(p))
                    : p_dtype == DType::f16  ? static_cast<double>(float16(p))
                                             : p;
  std::vector<bool> out(u.size());
  for (size_t i = 0; i < u.size(); ++i) out[i] = u[i] < pp;
  return out;
}

std::vector<int64_t> permutation_values(const Key& k, int64_t n) {
  // jax.random._shuffle(key, arange(n)): ceil(3 ln(n) / ln(2^32 - 1)) rounds, each a stable sort
  // by fresh 32-bit keys from split(key). A negative n is an empty range, as jnp.arange(n).
  const int64_t size = std::max<int64_t>(n, 0);
  std::vector<int64_t> x(static_cast<size_t>(size));
  std::iota(x.begin(), x.end(), int64_t{0});
  const auto rounds = static_cast<int>(std::ceil(
      3.0 * std::log(static_cast<double>(std::max<int64_t>(1, size))) / std::log(4294967295.0)));
  Key key = k;
  std::vector<size_t> order(x.size());
  std::vector<int64_t> next(x.size());
  for (int r = 0; r < rounds; ++r) {
    std::vector<Key> ks = split(key, 2);
    key = ks[0];
    const std::vector<uint32_t> sort_keys = bits32(ks[1], size);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return sort_keys[a] < sort_keys[b]; });
    for (size_t i = 0; i < order.size(); ++i) next[i] = x[order[i]];
    x.swap(next);
  }
  return x;
}

namespace {
template <class H, class V>
std::vector<H> halves(const std::vector<V>& v) {
  std::vector<H> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = H(static_cast<double>(v[i]));
  return h;
}
// Host values as a Tensor / Array of `dtype` (values are exact in it).
template <class V>
Tensor to_tensor(const std::vector<V>& v, Shape shape, Device device, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return tensor(std::vector<double>(v.begin(), v.end()), std::move(shape), device);
    case DType::i32:
      return tensor(std::vector<int32_t>(v.begin(), v.end()), std::move(shape), device);
    case DType::i64:
      return tensor(std::vector<int64_t>(v.begin(), v.end()), std::move(shape), device);
    case DType::bool_:
      return tensor(std::vector<bool>(v.begin(), v.end()), std::move(shape), device);
    case DType::bf16:
      return tensor(halves<bfloat16>(v), std::move(shape), device);
    case DType::f16:
      return tensor(halves<float16>(v), std::move(shape), device);
    default:
      return tensor(std::vector<float>(v.begin(), v.end()), std::move(shape), device);
  }
}
template <class V>
Array to_array(const std::vector<V>& v, Shape shape, const Sharding& s, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return device_put(std::vector<double>(v.begin(), v.end()), std::move(shape), s);
    case DType::i32:
      return device_put(std::vector<int32_t>(v.begin(), v.end()), std::move(shape), s);
    case DType::i64:
      return device_put(std::vector<int64_t>(v.begin(), v.end()), std::move(shape), s);
    case DType::bool_:
      return device_put(std::vector<bool>(v.begin(), v.end()), std::move(shape), s);
    case DType::bf16:
      return device_put(halves<bfloat16>(v), std::move(shape), s);
    case DType::f16:
      return device_put(halves<float16>(v), std::move(shape), s);
    default:
      return device_put(std::vector<float>(v.begin(), v.end()), std::move(shape), s);
  }
}
// The sharding's own checks (rank, divisibility, negative dimensions), worded for `api`, before
// any value is drawn.
void check_sharding(const Sharding& s, const Shape& shape, const char* api) {
  detail::checked_shard_shape(s, shape, api);
}
}  // namespace

Tensor uniform(const Key& k, Shape shape, Device device, DType dtype, double minval,
               double maxval) {
  return to_tensor(uniform_values(k, shape, dtype, minval, maxval), shape, device, dtype);
}
Tensor normal(const Key& k, Shape shape, Device device, DType dtype) {
  return to_tensor(normal_values(k, shape, dtype), shape, device, dtype);
}
Array normal(const Key& k, Shape shape, const Sharding& sharding, DType dtype) {
  check_float(dtype, "random.normal");
  check_sharding(sharding, shape, "random.normal");
  return to_array(normal_values(k, shape, dtype), shape, sharding, dtype);
}
Array uniform(const Key& k, Shape shape, const Sharding& sharding, DType dtype, double minval,
              double maxval) {
  check_float(dtype, "random.uniform");
  check_sharding(sharding, shape, "random.uniform");
  return to_array(uniform_values(k, shape, dtype, minval, maxval), shape, sharding, dtype);
}

Tensor randint(const Key& k, Shape shape, int64_t minval, int64_t maxval, Device device,
               DType dtype) {
  return to_tensor(randint_values(k, shape, minval, maxval, dtype), shape, device, dtype);
}
Array randint(const Key& k, Shape shape, int64_t minval, int64_t maxval, const Sharding& sharding,
              DType dtype) {
  check_int(dtype, "random.randint");
  check_sharding(sharding, shape, "random.randint");
  return to_array(randint_values(k, shape, minval, maxval, dtype), shape, sharding, dtype);
}

Tensor bernoulli(const Key& k, double p, Shape shape, Device device, DType p_dtype) {
  return to_tensor(bernoulli_values(k, p, shape, p_dtype), shape, device, DType::bool_);
}
Array bernoulli(const Key& k, double p, Shape shape, const Sharding& sharding, DType p_dtype) {
  check_float(p_dtype, "random.bernoulli", "the dtype of p");
  check_sharding(sharding, shape, "random.bernoulli");
  return to_array(bernoulli_values(k, p, shape, p_dtype), shape, sharding, DType::bool_);
}

Tensor permutation(const Key& k, int64_t n, Device device, DType dtype) {
  check_int(dtype, "random.permutation");
  const Shape shape{std::max<int64_t>(n, 0)};
  return to_tensor(permutation_values(k, n), shape, device, dtype);
}
Array permutation(const Key& k, int64_t n, const Sharding& sharding, DType dtype) {
  check_int(dtype, "random.permutation");
  const Shape shape{std::max<int64_t>(n, 0)};
  check_sharding(sharding, shape, "random.permutation");
  return to_array(permutation_values(k, n), shape, sharding, dtype);
}

}  // namespace meshrt::random
