#!/usr/bin/env python3
"""JAX's side of bench/bench_global.cpp, on the same machine: eager jnp ops on arrays sharded
over 8 forced host devices (TinyOp: x + x on 8 floats; SinLarge: 2*sin(x)+1 with MiB per device
as MESHRT_BENCH_MIB, default 64). Prints the median of several runs, in microseconds / ms.

    pip install jax
    python3 bench/jax_global_overhead.py
"""
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402


def median_time(fn, reps, inner):
    fn().block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn()
        out.block_until_ready()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def main():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    s = NamedSharding(mesh, P("x"))
    tiny = jax.device_put(jnp.full((8,), 0.5, jnp.float32), s)
    t = median_time(lambda: tiny + tiny, 7, 200)
    print(f"TinyOp/jax_eager      {t * 1e6:9.1f} us  (jax {jax.__version__})")
    mib = int(os.environ.get("MESHRT_BENCH_MIB", "64"))
    n = 8 * mib * (1 << 20) // 4
    big = jax.device_put(jnp.full((n,), 0.5, jnp.float32), s)
    t = median_time(lambda: 2 * jnp.sin(big) + 1, 5, 1)
    print(f"SinLarge/jax_eager    {t * 1e3:9.1f} ms  ({mib} MiB per device)")


if __name__ == "__main__":
    main()
