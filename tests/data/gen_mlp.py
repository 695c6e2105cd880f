#!/usr/bin/env python3
"""Loss and gradients of the shard_map tutorial's MLP from JAX (jax.grad), for tests/test_mlp.cpp.

    /tmp/jaxenv/bin/python tests/data/gen_mlp.py > tests/data/mlp_expected.txt

Lines: `loss <value>`, then per layer `dW<l> <sum> <sum of squares> <first 4 entries>` and the
same for `db<l>`, and `loss_after_sgd <lr> <loss after one SGD step>` (float32, JAX 0.10.2,
current PRNG stream).
"""
import jax
import jax.numpy as jnp


def init_layer(key, n_in, n_out):
    k1, k2 = jax.random.split(key)
    W = jax.random.normal(k1, (n_in, n_out)) / jnp.sqrt(n_in)
    b = jax.random.normal(k2, (n_out,))
    return W, b


def init(key, layer_sizes, batch_size):
    key, *keys = jax.random.split(key, len(layer_sizes))
    params = list(map(init_layer, keys, layer_sizes[:-1], layer_sizes[1:]))
    key, *keys = jax.random.split(key, 3)
    inputs = jax.random.normal(keys[0], (batch_size, layer_sizes[0]))
    targets = jax.random.normal(keys[1], (batch_size, layer_sizes[-1]))
    return params, (inputs, targets)


def predict(params, inputs):
    for W, b in params:
        outputs = jnp.dot(inputs, W) + b
        inputs = jax.nn.relu(outputs)
    return outputs


def loss(params, batch):
    inputs, targets = batch
    predictions = predict(params, inputs)
    return jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))


if __name__ == "__main__":  # gen_mlp_mixed.py imports init
    params, batch = init(jax.random.key(0), [784, 128, 128, 128, 128, 128, 8], 32)
    l, g = jax.value_and_grad(loss)(params, batch)
    print(f"loss {float(l):.9g}")
    for i, (dW, db) in enumerate(g):
        for name, t in ((f"dW{i}", dW), (f"db{i}", db)):
            flat = t.reshape(-1)
            print(name, f"{float(jnp.sum(t)):.9g} {float(jnp.sum(t * t)):.9g}", " ".join(f"{float(v):.9g}" for v in flat[:4]))
    for lr in (0.01, 0.001):
        new = [(W - lr * dW, b - lr * db) for (W, b), (dW, db) in zip(params, g)]
        print(f"loss_after_sgd {lr} {float(loss(new, batch)):.9g}")
