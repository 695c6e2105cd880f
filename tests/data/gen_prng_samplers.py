#!/usr/bin/env python3
"""Generates tests/data/prng_samplers_expected.txt: jax.random.randint, bernoulli and permutation
in both threefry streams (JAX 0.10.2, jax_enable_x64 on, as gen_prng.py).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python3 tests/data/gen_prng_samplers.py > tests/data/prng_samplers_expected.txt

Lines: `<stream> <op> <seed> <args> <dtype> <shape> : <values>` where stream is current
(jax_threefry_partitionable=True) or legacy (False); args are comma-separated (randint:
minval,maxval; bernoulli: p, drawn in dtype; permutation: n); values are decimal integers
(bernoulli: 0 or 1); shape is comma-separated.
"""
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

SEEDS = (0, 1, 42, 2**32 + 5, 123456789)
SHAPES = ((8,), (3, 5), (1,), (0,), (2, 3, 4))


def emit(stream, op, seed, args, dtype, arr):
    a = np.asarray(arr)
    shape = ",".join(map(str, a.shape))
    vals = " ".join(str(int(v)) for v in a.reshape(-1))
    args = ",".join(repr(x) for x in args)
    print(f"{stream} {op} {seed} {args} {dtype} {shape} : {vals}")


def main():
    for stream, flag in (("current", True), ("legacy", False)):
        jax.config.update("jax_threefry_partitionable", flag)
        for seed in SEEDS:
            k = jax.random.key(seed)
            for dtype, ranges in (
                ("int32", ((0, 10), (-5, 5), (0, 1), (3, 3), (5, 2), (-100, 1000),
                           (0, 2**31), (-2**31, 2**31), (-2**40, 2**40), (7, 2**31 - 1))),
                ("int64", ((0, 10), (-5, 5), (0, 1), (5, 2), (-2**40, 2**40),
                           (-2**63, 2**63 - 1), (0, 10**18 + 7), (-3, 2**62))),
            ):
                for lo, hi in ranges:
                    for shape in SHAPES:
                        emit(stream, "randint", seed, (lo, hi), dtype,
                             jax.random.randint(k, shape, lo, hi, getattr(jnp, dtype)))
            # bfloat16/float16 p: JAX draws uniform in p's dtype and compares there (meshrt
            # draws 16-bit uniforms in the current stream only).
            dtypes = ("float32", "float64") + (("bfloat16", "float16") if flag else ())
            for dtype in dtypes:
                for p in (0.5, 0.1, 0.0, 1.0, 0.9999, 1e-9, -0.5, 1.5):
                    for shape in SHAPES:
                        emit(stream, "bernoulli", seed, (p,), dtype,
                             jax.random.bernoulli(k, getattr(jnp, dtype)(p), shape))
            for n in (0, 1, 2, 3, 10, 100, 1625, 1626, -1):
                emit(stream, "permutation", seed, (n,), "int64", jax.random.permutation(k, n))
        # Long draws, one seed: many values, and permutations of 2 sort rounds (n > 1625) with
        # tied sort keys (n = 20000).
        k = jax.random.key(0)
        emit(stream, "randint", 0, (-1000, 1000), "int32", jax.random.randint(k, (2000,), -1000, 1000, jnp.int32))
        emit(stream, "randint", 0, (-2**40, 2**40), "int64", jax.random.randint(k, (2000,), -2**40, 2**40, jnp.int64))
        emit(stream, "bernoulli", 0, (0.25,), "float32", jax.random.bernoulli(k, np.float32(0.25), (2000,)))
        emit(stream, "bernoulli", 0, (0.25,), "float64", jax.random.bernoulli(k, np.float64(0.25), (2000,)))
        if flag:
            for dtype in ("bfloat16", "float16"):
                emit(stream, "bernoulli", 0, (0.3,), dtype, jax.random.bernoulli(k, getattr(jnp, dtype)(0.3), (2000,)))
        for n in (1700, 20000):
            emit(stream, "permutation", 0, (n,), "int64", jax.random.permutation(k, n))
        # A derived key (the init pattern: split, fold_in).
        k = jax.random.fold_in(jax.random.split(jax.random.key(9))[1], 3)
        emit(stream, "randint_derived", 9, (-7, 300), "int32", jax.random.randint(k, (64,), -7, 300, jnp.int32))
        emit(stream, "bernoulli_derived", 9, (0.3,), "float32", jax.random.bernoulli(k, np.float32(0.3), (64,)))
        emit(stream, "permutation_derived", 9, (64,), "int64", jax.random.permutation(k, 64))


if __name__ == "__main__":
    main()
