#!/usr/bin/env python3
"""JAX's side of meshrt-mlp-bench's last table (the device-resident step), on the same machine:
jax.jit(jax.value_and_grad(loss)) of the seed MLP [784, 1024 x 5, 8], batch 8192, float32, on 8
forced host devices, for the five strategies of examples/mlp (the shardings of mlp::placement),
parameters and batch placed once. Prints the median step time, and the compute bound measured
the way meshrt-mlp-bench measures it (the step's FLOPs at the rate of a (B/8, H) x (H, H) float32
matmul on each of the 8 devices at once, XLA's own matmul, measured next to every step; the
ratio is the median of the per-step ratios, and the rate's median is printed).

    pip install jax
    python3 bench/jax_mlp_step.py [--quick] [--repeats N] [--strategy single|dp|fsdp|tp|2d]

Each strategy runs in a subprocess with a time limit: XLA's CPU collectives across 8 forced host
devices on a 2-core host have been seen to stall in their rendezvous; a strategy that does not
finish is reported as such instead of hanging the script.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

STRATEGIES = ["single", "dp", "fsdp", "tp", "2d"]


def sizes(quick):
    b, h = (512, 256) if quick else (8192, 1024)
    return b, h, [784, h, h, h, h, h, 8]


def flops(b, layers):
    per_pass = sum(2.0 * b * layers[i] * layers[i + 1] for i in range(len(layers) - 1))
    return 3 * per_pass - 2.0 * b * layers[0] * layers[1]


def child(strategy, quick, repeats):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    def make_mesh(shape, names):  # Auto axes: jit places the ops, as meshrt's global view does
        return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))

    b, h, layers = sizes(quick)
    devs = jax.devices()
    if strategy == "single":
        mesh = Mesh(devs[:1], ("batch",))
        xs, ws, bs = P(), P(), P()
    elif strategy == "2d":
        mesh = make_mesh((4, 2), ("batch", "model"))
        xs, ws, bs = P("batch", "model"), P("model"), P("model")
    else:
        mesh = make_mesh((8,), ("batch",))
        xs, ws, bs = {"dp": (P("batch"), P(), P()),
                      "fsdp": (P("batch"), P("batch"), P("batch")),
                      "tp": (P(None, "batch"), P("batch"), P("batch"))}[strategy]

    key = jax.random.key(0)
    params = []
    for i in range(len(layers) - 1):
        key, k1, k2 = jax.random.split(key, 3)
        w = jax.random.normal(k1, (layers[i], layers[i + 1]), jnp.float32) / layers[i] ** 0.5
        bias = jax.random.normal(k2, (layers[i + 1],), jnp.float32)
        params.append((jax.device_put(w, NamedSharding(mesh, ws)),
                       jax.device_put(bias, NamedSharding(mesh, bs))))
    key, kx, ky = jax.random.split(key, 3)
    x = jax.device_put(jax.random.normal(kx, (b, layers[0]), jnp.float32), NamedSharding(mesh, xs))
    y = jax.device_put(jax.random.normal(ky, (b, layers[-1]), jnp.float32), NamedSharding(mesh, xs))

    def loss(params, x, y):
        a = x
        for i, (w, bias) in enumerate(params):
            z = a @ w + bias
            a = jax.nn.relu(z) if i + 1 < len(params) else z
        diff = a - y
        return jnp.sum(diff * diff) / x.shape[0]

    step = jax.jit(jax.value_and_grad(loss))
    jax.block_until_ready(step(params, x, y))  # compile

    # The bound's sgemm: every device multiplies its own (b/8, h) x (h, h) block at once.
    mesh8 = make_mesh((8,), ("batch",))
    ma = jax.device_put(jnp.ones((b, h), jnp.float32), NamedSharding(mesh8, P("batch")))
    mb = jax.device_put(jnp.ones((h, h), jnp.float32), NamedSharding(mesh8, P()))
    mm = jax.jit(lambda u, v: u @ v)
    jax.block_until_ready(mm(ma, mb))

    steps, ratios, rates = [], [], []
    for _ in range(repeats):
        mm_times = []
        for _ in range(3):
            t0 = time.perf_counter()
            jax.block_until_ready(mm(ma, mb))
            mm_times.append(time.perf_counter() - t0)
        rate = 2.0 * b * h * h / statistics.median(mm_times)
        rates.append(rate)
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, x, y))
        steps.append(time.perf_counter() - t0)
        ratios.append(steps[-1] / (flops(b, layers) / rate))
    print(f"{strategy} {statistics.median(steps) * 1e3:.1f} {statistics.median(ratios):.2f} "
          f"{statistics.median(rates) / 1e9:.1f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--strategy", choices=STRATEGIES)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per strategy")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.quick, args.repeats)
        return
    import jax
    b, h, layers = sizes(args.quick)
    print(f"JAX {jax.__version__}: MLP {layers}, batch {b}, float32, 8 forced host devices; "
          f"{args.repeats} repeats, medians; the step is {flops(b, layers) / 1e9:.1f} GFLOP")
    print(f"{'strategy':<10} {'jit':>12} {'jit/bound':>10} {'sgemm GFLOP/s':>14}")
    for s in [args.strategy] if args.strategy else STRATEGIES:
        cmd = [sys.executable, __file__, "--child", s, "--repeats", str(args.repeats)]
        if args.quick:
            cmd.append("--quick")
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{s:<10} did not finish in {args.timeout:.0f} s (XLA's collectives stalled)")
            continue
        line = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
        if not line:
            err = [ln for ln in out.stderr.strip().splitlines() if "Error" in ln][-1:]
            print(f"{s:<10} failed: {err or out.stderr.strip().splitlines()[-1:]}")
            continue
        _, ms, ratio, rate = line[0].split()
        print(f"{s:<10} {float(ms):9.1f} ms {float(ratio):9.2f}x {float(rate):14.1f}")


if __name__ == "__main__":
    main()
