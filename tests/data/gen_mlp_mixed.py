#!/usr/bin/env python3
"""Mixed-precision training of the seed MLP from JAX, for tests/test_mlp.cpp (MlpMixed).

    python3 tests/data/gen_mlp_mixed.py > tests/data/mlp_mixed_expected.txt

The model, init and loss of gen_mlp.py ([784, 128 x 5, 8], batch 32, key 0), trained with SGD
(lr 0.001, 5 steps) in two precisions from the same init and data:
  f32:  everything float32;
  bf16: JAX's usual mixed-precision recipe: float32 master parameters, the loss casts the
        parameters and the inputs to bfloat16 (astype), runs the layers in bfloat16, casts the
        predictions back to float32 and takes the loss in float32; value_and_grad gives float32
        gradients through the casts; the update is applied to the float32 parameters.
Each under jax.jit on 8 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set
here) with the batch and parameters placed as examples/mlp places them: dp (x on P('batch'),
parameters replicated) and fsdp (x and every parameter's dim 0 on P('batch')).

Lines:
  loss <strategy> <precision> <step> <loss before that step's update>
  grad_dtype <precision> <dtype of every gradient leaf>
  grad <precision> dW<l>|db<l> <sum> <sum of squares> <first 4 entries>   (dp, step 0)
JAX 0.10.2, float32 printed with 9 significant digits.
"""
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from gen_mlp import init  # noqa: E402  (the same model and init)

SIZES = [784, 128, 128, 128, 128, 128, 8]
BATCH, LR, STEPS = 32, 0.001, 5


def loss(params, x, y, compute):
    # Mixed precision: cast the float32 master parameters and the inputs to the compute dtype.
    params = jax.tree.map(lambda a: a.astype(compute), params)
    a = x.astype(compute)
    for i, (W, b) in enumerate(params):
        z = a @ W + b
        a = jax.nn.relu(z) if i + 1 < len(params) else z
    diff = a.astype(jnp.float32) - y  # the loss in float32
    return jnp.sum(diff * diff) / x.shape[0]


def main():
    params0, (x0, y0) = init(jax.random.key(0), SIZES, BATCH)
    mesh = Mesh(jax.devices()[:8], ("batch",))  # automatic axes: jax.jit places every op
    place = {
        "dp": (P("batch"), P(), P()),
        "fsdp": (P("batch"), P("batch"), P("batch")),
    }
    for precision, compute in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        step = jax.jit(jax.value_and_grad(lambda p, x, y: loss(p, x, y, compute)))
        for strategy, (xs, ws, bs) in place.items():
            put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
            params = [(put(W, ws), put(b, bs)) for W, b in params0]
            x, y = put(x0, xs), put(y0, xs)
            for i in range(STEPS):
                l, g = step(params, x, y)
                print(f"loss {strategy} {precision} {i} {float(l):.9g}")
                if i == 0 and strategy == "dp":
                    dtypes = {str(leaf.dtype) for leaf in jax.tree.leaves(g)}
                    print(f"grad_dtype {precision} {' '.join(sorted(dtypes))}")
                    for li, (dW, db) in enumerate(g):
                        for name, t in ((f"dW{li}", dW), (f"db{li}", db)):
                            flat = t.reshape(-1)
                            print(f"grad {precision} {name} {float(jnp.sum(t)):.9g} "
                                  f"{float(jnp.sum(t * t)):.9g} "
                                  + " ".join(f"{float(v):.9g}" for v in flat[:4]))
                params = jax.tree.map(lambda w, d: w - LR * d, params, g)


if __name__ == "__main__":
    main()
