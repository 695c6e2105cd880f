#!/usr/bin/env python3
"""JAX's side of bench/bench_jit.cpp's AdamUpdate rows, on the same machine: adam's update of one
(rows, 1024) float32 leaf sharded P("x") over 8 forced host devices, the same arithmetic as
bench_jit.cpp's adam_update (m, v and p from g; bias corrections as constants), eager and under
jax.jit (XLA fuses it into loops over the elements). Prints the median of 5 repetitions of a
timed loop, in milliseconds, for rows 1024 and 8192.

    pip install jax
    python3 bench/jax_adam_update.py
"""
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402


def adam_update(p, m, v, g):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * (g * g)
    mhat = m / (1.0 - 0.9)
    vhat = v / (1.0 - 0.999)
    return p - 1e-3 * (mhat / (jnp.sqrt(vhat) + 1e-8)), m, v


def median_ms(f, *args, iters=10, reps=5):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(times)


def main():
    mesh = jax.make_mesh((8,), ("x",))
    s = NamedSharding(mesh, P("x"))
    jitted = jax.jit(adam_update)
    print(f"jax {jax.__version__}, {jax.device_count()} cpu devices")
    for rows in (1024, 8192):
        def full(v):
            return jax.device_put(jnp.full((rows, 1024), v, jnp.float32), s)

        args = (full(1.0), full(0.5), full(0.25), full(0.125))
        gbs = 7 * rows * 1024 * 4 / 1e9
        for name, f in (("eager", adam_update), ("jit", jitted)):
            t = median_ms(f, *args)
            print(f"AdamUpdate/{name}/{rows}: {t:.2f} ms ({gbs / t * 1e3:.1f} GB/s)")


if __name__ == "__main__":
    main()
