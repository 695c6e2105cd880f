#!/usr/bin/env python3
"""Generates tests/data/prng_expected.txt with JAX (jax_enable_x64 on, both threefry streams).

    /tmp/jaxenv/bin/python tests/data/gen_prng.py > tests/data/prng_expected.txt

Lines: `<stream> <case> <kind> <shape> : <values>` where stream is current
(jax_threefry_partitionable=True) or legacy (False); kind is key (uint32 pairs), bits (uint32),
f32 (float32 bit patterns, hex) or f64 (float64 bit patterns, hex); shape is comma-separated.
"""
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)


def emit(stream, case, arr, kind):
    a = np.asarray(arr)
    shape = ",".join(map(str, a.shape))
    if kind == "key":
        vals = " ".join(str(int(v)) for v in a.reshape(-1))
    elif kind == "bits":
        vals = " ".join(str(int(v)) for v in a.reshape(-1))
    elif kind == "f32":
        vals = " ".join(f"{int(v):08x}" for v in a.astype(np.float32).view(np.uint32).reshape(-1))
    else:
        vals = " ".join(f"{int(v):016x}" for v in a.astype(np.float64).view(np.uint64).reshape(-1))
    print(f"{stream} {case} {kind} {shape} : {vals}")


def data(k):
    return jax.random.key_data(k)


def main():
    for stream, flag in (("current", True), ("legacy", False)):
        jax.config.update("jax_threefry_partitionable", flag)
        for seed in (0, 1, 42, 2**32 + 5, 123456789):
            k = jax.random.key(seed)
            c = f"seed{seed}"
            emit(stream, c + "_key", data(k), "key")
            for n in (2, 3, 5):
                emit(stream, f"{c}_split{n}", data(jax.random.split(k, n)), "key")
            for d in (0, 7, 2**31 + 3):
                emit(stream, f"{c}_fold{d}", data(jax.random.fold_in(k, d)), "key")
            for shape in ((8,), (3, 5), (1,), (0,), (2, 3, 4)):
                s = "x".join(map(str, shape))
                emit(stream, f"{c}_bits{s}", jax.random.bits(k, shape, dtype=jnp.uint32), "bits")
                emit(stream, f"{c}_uniform32_{s}", jax.random.uniform(k, shape, dtype=jnp.float32), "f32")
                emit(stream, f"{c}_normal32_{s}", jax.random.normal(k, shape, dtype=jnp.float32), "f32")
                emit(stream, f"{c}_uniform64_{s}", jax.random.uniform(k, shape, dtype=jnp.float64), "f64")
                emit(stream, f"{c}_normal64_{s}", jax.random.normal(k, shape, dtype=jnp.float64), "f64")
            emit(stream, f"{c}_uniform32_range", jax.random.uniform(k, (6,), jnp.float32, -2.5, 7.0), "f32")
            emit(stream, f"{c}_uniform64_range", jax.random.uniform(k, (6,), jnp.float64, -2.5, 7.0), "f64")
            # A tree: split, fold_in, split again, then draw (the MLP init pattern).
            k1, k2 = jax.random.split(k)
            k3 = jax.random.fold_in(k2, 11)
            ks = jax.random.split(k3, 4)
            emit(stream, f"{c}_tree_keys", data(ks), "key")
            emit(stream, f"{c}_tree_normal32", jax.random.normal(ks[2], (4, 6), jnp.float32), "f32")
            emit(stream, f"{c}_tree_normal32_k1", jax.random.normal(k1, (64,), jnp.float32), "f32")
        # Many values, to cover erf_inv's tails.
        emit(stream, "seed7_normal32_big", jax.random.normal(jax.random.key(7), (20000,), jnp.float32), "f32")
        emit(stream, "seed7_normal64_big", jax.random.normal(jax.random.key(7), (4000,), jnp.float64), "f64")


if __name__ == "__main__":
    main()
