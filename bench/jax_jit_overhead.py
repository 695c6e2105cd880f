#!/usr/bin/env python3
"""JAX's side of bench/bench_jit.cpp, on the same machine: the same 20-op program (program20)
on (8, 8) float32 sharded P("x") over 8 forced host devices, eager and under jax.jit, and
2*sin(x)+1 jitted. Prints the median of several runs in microseconds. Program20/local sums op 19 over the unsharded
dim instead (no collective): on a 2-core host XLA:CPU's all-reduce over 8 forced devices can stall
in its rendezvous (40 s timeout, process abort), so the psum variant runs only with
JAX_BENCH_COLLECTIVE=1.

    pip install jax
    python3 bench/jax_jit_overhead.py
"""
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402


def program20(x, y, over=0):
    a = jnp.sin(x)  # 1
    b = a * 2.0  # 2
    c = b + 1.0  # 3
    d = c * y  # 4
    e = jnp.exp(d)  # 5
    f = e - y  # 6
    g = jnp.tanh(f)  # 7
    h = g / 3.0  # 8
    i = h + a  # 9
    j = jnp.maximum(i, c)  # 10
    k = jnp.sum(j, 1, keepdims=True)  # 11
    l = j - k  # 12
    m = l * l  # 13
    n = jnp.sqrt(m + 1.0)  # 14, 15
    o = jnp.log(n)  # 16
    p = jnp.max(o, 1, keepdims=True)  # 17
    q = o - p  # 18
    r = jnp.sum(q, over)  # 19 (over=0: the sharded dim, a psum)
    return jnp.tanh(r)  # 20


def sin3(x):
    return 2.0 * jnp.sin(x) + 1.0


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
    x = jax.device_put(jnp.full((8, 8), 0.5, jnp.float32), s)
    y = jax.device_put(jnp.full((8, 8), 0.25, jnp.float32), s)
    print(f"jax {jax.__version__}, medians of 7 runs")
    jl = jax.jit(lambda a, b: program20(a, b, 1))
    js = jax.jit(sin3)
    print(f"Program20/local/jax_jit    {median_time(lambda: jl(x, y), 7, 200) * 1e6:9.1f} us")
    print(f"Program20/local/jax_eager  {median_time(lambda: program20(x, y, 1), 7, 20) * 1e6:9.1f} us")
    print(f"Sin/jax_jit                {median_time(lambda: js(x), 7, 200) * 1e6:9.1f} us")
    if os.environ.get("JAX_BENCH_COLLECTIVE") == "1":
        jp = jax.jit(program20)
        print(f"Program20/jax_jit          {median_time(lambda: jp(x, y), 7, 200) * 1e6:9.1f} us")


if __name__ == "__main__":
    main()
