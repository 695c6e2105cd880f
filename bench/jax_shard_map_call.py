#!/usr/bin/env python3
"""JAX's side of bench_collectives' BM_shard_map_call_psum_1_float, on the same machine: a jitted
shard_map whose body is one psum, over 8 forced host devices, input one float per device
(P("x")), output replicated (P()). Prints the median time per call in microseconds (each call
waited for with block_until_ready, as meshrt's call returns a ready Array).

    pip install jax
    python3 bench/jax_shard_map_call.py
"""
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

try:
    from jax import shard_map  # JAX >= 0.6
except ImportError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map  # type: ignore


def main():
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(jnp.ones((8,), jnp.float32), NamedSharding(mesh, P("x")))
    f = jax.jit(shard_map(lambda t: jax.lax.psum(t, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P()))
    f(x).block_until_ready()
    times = []
    for _ in range(9):
        inner = 2000
        t0 = time.perf_counter()
        for _ in range(inner):
            f(x).block_until_ready()
        times.append((time.perf_counter() - t0) / inner)
    print(f"jax {jax.__version__} jit(shard_map(psum)) of one float, 8 devices: "
          f"{statistics.median(times) * 1e6:.1f} us per call (median of 9)")


if __name__ == "__main__":
    main()
