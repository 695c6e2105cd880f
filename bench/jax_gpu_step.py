#!/usr/bin/env python3
"""JAX's side of the GPU bundle's benchmark table: jax.jit(jax.value_and_grad(loss)) of the seed
MLP [784, 1024 x 5, 8], batch 8192, float32 (the model and loss of examples/mlp and
bench/jax_mlp_step.py), on JAX's first GPU, at matmul precision "highest" (true fp32) and
"default" (TF32 tensor cores on Ampere and later), plus the step's 16 matrix products alone at
each precision (the bound meshrt's step is held to); then the same step in bf16 mixed precision
(examples/mlp's mlp::Precision::bf16, JAX's usual recipe: float32 master parameters cast to
bfloat16 inside the loss with the inputs, bfloat16 layers, the loss of the predictions cast back
to float32; float32 gradients) and its 16 products in bfloat16 (`step_bf16`, `products_bf16`:
meshrt-mlp-bench --dtype bf16's row). Each time is a median of --repeats steps,
each ending in jax.block_until_ready. Prints one line per measurement: `jax <name> <ms>`.

    python3 bench/jax_gpu_step.py [--repeats 50] [--quick]
"""
import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="run on JAX's cpu (to check the script)")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp

    gpus = [d for d in jax.devices() if d.platform == "gpu" or args.cpu]
    if not gpus:
        print("jax: no GPU device (jax.devices() = %s)" % jax.devices(), file=sys.stderr)
        return 1
    dev = gpus[0]
    b, h = (512, 256) if args.quick else (8192, 1024)
    layers = [784, h, h, h, h, h, 8]
    key = jax.random.key(0)
    params = []
    for i in range(len(layers) - 1):
        key, k1, k2 = jax.random.split(key, 3)
        w = jax.random.normal(k1, (layers[i], layers[i + 1]), jnp.float32) / layers[i] ** 0.5
        bias = jax.random.normal(k2, (layers[i + 1],), jnp.float32)
        params.append((jax.device_put(w, dev), jax.device_put(bias, dev)))
    key, kx, ky = jax.random.split(key, 3)
    x = jax.device_put(jax.random.normal(kx, (b, layers[0]), jnp.float32), dev)
    y = jax.device_put(jax.random.normal(ky, (b, layers[-1]), jnp.float32), dev)

    def loss(params, x, y):
        a = x
        for i, (w, bias) in enumerate(params):
            z = a @ w + bias
            a = jax.nn.relu(z) if i + 1 < len(params) else z
        diff = a - y
        return jnp.sum(diff * diff) / x.shape[0]

    def timed(fn, *a):
        jax.block_until_ready(fn(*a))  # compile
        t = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*a))
            t.append(time.perf_counter() - t0)
        return statistics.median(t)

    acts, gs = [], []
    for i in range(len(layers) - 1):
        key, ka, kg = jax.random.split(key, 3)
        acts.append(jax.device_put(jax.random.normal(ka, (b, layers[i]), jnp.float32), dev))
        gs.append(jax.device_put(jax.random.normal(kg, (b, layers[i + 1]), jnp.float32), dev))
    print(f"jax version {jax.__version__} on {dev.device_kind}")
    for precision in ("highest", "default"):
        with jax.default_matmul_precision(precision):
            step = jax.jit(jax.value_and_grad(loss))
            print(f"jax step_{precision} {timed(step, params, x, y) * 1e3:.3f}")

            # The step's products alone: forward a @ W, backward a^T @ g and g @ W^T, on random
            # operands passed in (constants could let XLA rewrite a product as a reduction).
            def products(params, acts, gs):
                outs = []
                for i, (w, _) in enumerate(params):
                    outs.append(acts[i] @ w)
                    outs.append(acts[i].T @ gs[i])
                    if i > 0:
                        outs.append(gs[i] @ w.T)
                return outs

            mm = jax.jit(products)
            print(f"jax products_{precision} {timed(mm, params, acts, gs) * 1e3:.3f}")

    bf16 = jnp.bfloat16

    def mixed_loss(params, x, y):
        a = x.astype(bf16)
        for i, (w, bias) in enumerate(params):
            z = a @ w.astype(bf16) + bias.astype(bf16)
            a = jax.nn.relu(z) if i + 1 < len(params) else z
        diff = a.astype(jnp.float32) - y  # the loss in float32
        return jnp.sum(diff * diff) / x.shape[0]

    print(f"jax step_bf16 {timed(jax.jit(jax.value_and_grad(mixed_loss)), params, x, y) * 1e3:.3f}")
    cast = lambda t: jax.tree.map(lambda a: a.astype(bf16), t)  # noqa: E731
    print(f"jax products_bf16 {timed(mm, cast(params), cast(acts), cast(gs)) * 1e3:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
