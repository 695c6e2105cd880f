#!/usr/bin/env python3
"""Generates tests/data/optim_expected.txt: what optax's optimizers and schedules give, for
tests/test_optim.cpp (meshrt::optim against optax; no Python at test time).

    pip install optax jax      # CPU jax/jaxlib
    python3 tests/data/gen_optim.py            # writes tests/data/optim_expected.txt

JAX runs as users run optax: float32, jax_enable_x64 off (the step count is int32), each
`update` and each schedule evaluation under jax.jit, on one CPU device. Inputs come from
fixed-seed NumPy generators and are stored in the file, so re-running the script with the same
JAX and optax versions gives the identical file.

File format ('#' lines are comments, a blank line between records):

    schedule <id>                       a schedule of SCHEDULES (the C++ test builds the same)
    counts <int>...                     step counts it is evaluated at (int32)
    values <float>...                   its float32 values there

    case <opt>.<tree>                   optimizer OPTIMIZERS[opt] on tree TREES[tree]
    case <opt>.<tree> <dtype>           the same with params and grads of <dtype> (bf16, f16):
                                        LOWP_CASES, optimizer OPTIMIZERS[opt] or LOWP_OPTIMIZERS[opt]
    parts <class>...                    the chain's per-transform states, flattened depth first
                                        (optax's nested tuples of NamedTuples): their class names
    param <k> <shape> <floats>          initial parameter leaf k (tree order)
    step <t>                            then, for step t = 1..STEPS:
    grad <k> <shape> <floats>             the gradient given to update (stored random values)
    update <k> <shape> <floats>           the updates update returned
    param <k> <shape> <floats>            optax.apply_updates(params, updates)
    count <part> <int>                    the int32 count of state part <part>, if it has one
    slot <part> <field> <k> <shape> <floats>   leaf k of field <field> (mu, nu, trace) of part

<shape>: comma list or `scalar`, preceded by the leaf's dtype (`bf16 8,2`, `f16 4`) when it is
not float32. Floats are float32 values written as the shortest decimal that reads back as the
same float32 (parse with strtof); bf16 and f16 values are exact float32 values, so they read back
exactly too.

The low-precision cases (after the float32 ones, their own NumPy generator) are optax's behaviour
with bfloat16 / float16 params: by default every moment has the parameter's dtype;
`mu_dtype=jnp.float32` makes adam's mu float32 (nu stays bf16, the updates come out float32);
`accumulator_dtype=jnp.float32` makes sgd's trace float32; a scheduled weight decay (a float32
Array) promotes the updates to float32; apply_updates casts back to the parameter's dtype.
"""
import os

os.environ["JAX_PLATFORMS"] = "cpu"
# Every bfloat16/float16 op rounds to its dtype, as JAX defines each op (and as eager JAX computes
# it): by default XLA's CPU compiler may keep a fused chain of bf16 ops in float32 ("excess
# precision"), which shows where a bf16 intermediate (Adam's nu, the clip norm) feeds a float32
# result. No effect on the float32 cases.
os.environ["XLA_FLAGS"] = "--xla_allow_excess_precision=false"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_expected.txt")
STEPS = 5

# Per step, the gradients' scale: clip_by_global_norm(1.0) clips some steps and not others.
GRAD_SCALES = [0.05, 1.0, 0.08, 0.5, 0.02]

# Parameter trees as leaf shapes in tree order (the C++ test builds the trees named here).
TREES = {
    # one Array
    "vec": [(16,)],
    # std::map<std::string, Array>{{"b", {8}}, {"w", {8, 2}}} (keys sorted, as JAX sorts dicts)
    "map": [(8,), (8, 2)],
    # struct Mlp { Array w1, b1; std::vector<Array> head; }: w1 {8,4}, b1 {4}, head {w2 {4,2}, b2 {2}}
    "mlp": [(8, 4), (4,), (4, 2), (2,)],
}

wc = optax.warmup_cosine_decay_schedule

SCHEDULES = {
    "constant": optax.constant_schedule(0.3),
    "linear_warmup": optax.linear_schedule(0.0, 1e-3, 10),
    "linear_decay": optax.linear_schedule(1.0, 0.25, 7),
    "linear_zero_steps": optax.linear_schedule(0.5, 2.0, 0),
    "cosine": optax.cosine_decay_schedule(1e-3, 20),
    "cosine_alpha": optax.cosine_decay_schedule(2.0, 9, alpha=0.2),
    "warmup_cosine": wc(0.0, 1e-3, 5, 25),
    "warmup_cosine_end": wc(1e-4, 3e-3, 4, 30, end_value=1e-5),
    "warmup_cosine_no_warmup": wc(0.0, 1.0, 0, 12, end_value=0.1),
}
SCHEDULE_COUNTS = list(range(0, 36)) + [100, 1000, 123456]

OPTIMIZERS = {
    "sgd": optax.sgd(0.1),
    "sgd_momentum": optax.sgd(0.1, momentum=0.9),
    "sgd_nesterov": optax.sgd(0.05, momentum=0.9, nesterov=True),
    "sgd_linear": optax.sgd(optax.linear_schedule(0.1, 0.01, 3), momentum=0.5),
    "sgd_constant_schedule": optax.sgd(optax.constant_schedule(0.1)),
    "adam": optax.adam(1e-2),
    "adam_custom": optax.adam(3e-3, b1=0.8, b2=0.99, eps=1e-6),
    "adam_cosine": optax.adam(optax.cosine_decay_schedule(1e-2, 4, alpha=0.1)),
    "adamw": optax.adamw(1e-2),
    "adamw_wd": optax.adamw(5e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1),
    "adamw_wd_schedule": optax.adamw(1e-2, weight_decay=optax.linear_schedule(0.0, 0.2, 4)),
    "clip": optax.clip_by_global_norm(1.0),
    "clip_adamw_warmup_cosine": optax.chain(optax.clip_by_global_norm(1.0),
                                            optax.adamw(wc(0.0, 1e-2, 2, 5))),
    "clip_sgd_nesterov": optax.chain(optax.clip_by_global_norm(0.5),
                                     optax.sgd(0.2, momentum=0.8, nesterov=True)),
}

f32 = jnp.float32

# Optimizers only the low-precision cases use: float32 state for low-precision params.
LOWP_OPTIMIZERS = {
    "sgd_momentum_acc32": optax.sgd(0.1, momentum=0.9, accumulator_dtype=f32),
    "sgd_nesterov_acc32": optax.sgd(0.05, momentum=0.9, nesterov=True, accumulator_dtype=f32),
    "adam_mu32": optax.adam(1e-2, mu_dtype=f32),
    # float16's eps: 1e-8 rounds to 0 in float16, where a nu that underflows would divide by 0.
    "adam_mu32_eps": optax.adam(1e-2, eps=1e-4, mu_dtype=f32),
    "adamw_mu32": optax.adamw(5e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mu_dtype=f32),
    "adamw_wd_schedule_mu32": optax.adamw(1e-2, weight_decay=optax.linear_schedule(0.0, 0.2, 4),
                                          mu_dtype=f32),
    "clip_adamw_mu32_warmup_cosine": optax.chain(optax.clip_by_global_norm(1.0),
                                                 optax.adamw(wc(0.0, 1e-2, 2, 5), mu_dtype=f32)),
    "clip_sgd_nesterov_acc32": optax.chain(
        optax.clip_by_global_norm(0.5),
        optax.sgd(0.2, momentum=0.8, nesterov=True, accumulator_dtype=f32)),
}

# (optimizer, tree, dtype of params and grads): every optimizer with the default state (the
# parameter's dtype) and with float32 state, several steps, clipping and schedules among them,
# on the mlp tree (its leaves split and replicated under the test's FSDP placement).
LOWP_CASES = [(o, "mlp", "bf16") for o in [
    "sgd", "sgd_momentum", "sgd_nesterov", "sgd_linear", "adam", "adam_cosine", "adamw_wd",
    "adamw_wd_schedule", "clip", "clip_adamw_warmup_cosine", "clip_sgd_nesterov",
    *(o for o in LOWP_OPTIMIZERS if o != "adam_mu32_eps")]]
LOWP_CASES += [(o, "mlp", "f16") for o in ["sgd_momentum", "sgd_nesterov_acc32", "adam_mu32_eps",
                                           "clip_sgd_nesterov_acc32"]]
LOWP_DTYPES = {"bf16": jnp.bfloat16, "f16": jnp.float16}


def fmt(v):
    return np.format_float_scientific(np.float32(v), unique=True, trim="-")


def enc_shape(shape):
    return "scalar" if len(shape) == 0 else ",".join(map(str, shape))


def enc_leaf(x):
    x = np.asarray(x)
    prefix = ""
    if x.dtype != np.float32:
        prefix = {np.dtype(jnp.bfloat16): "bf16 ", np.dtype(np.float16): "f16 "}[x.dtype]
        x = x.astype(np.float32)  # exact
    assert np.all(np.isfinite(x)), ("non-finite value", x)
    return prefix + enc_shape(x.shape) + " " + " ".join(fmt(v) for v in x.reshape(-1))


def parts_of(state):
    """optax's chain state (nested tuples of NamedTuples) flattened depth first."""
    if hasattr(state, "_fields"):
        return [state]
    assert isinstance(state, tuple), type(state)
    out = []
    for s in state:
        out += parts_of(s)
    return out


def main():
    lines = [
        "# optim_expected.txt -- generated by tests/data/gen_optim.py; do not edit.",
        f"# optax {optax.__version__} / jax {jax.__version__}, CPU, float32, "
        "jax_enable_x64 off (int32 counts), update and schedules under jax.jit.",
        "# See the script's docstring for the format.",
        "",
    ]
    for sid, sched in SCHEDULES.items():
        counts = np.asarray(SCHEDULE_COUNTS, np.int32)
        vals = np.asarray(jax.jit(jax.vmap(lambda c, s=sched: jnp.asarray(s(c), jnp.float32)))(
            counts))
        lines += [f"schedule {sid}", "counts " + " ".join(map(str, counts)),
                  "values " + " ".join(fmt(v) for v in vals), ""]

    rng = np.random.default_rng(20240611)
    cases = [(oid, tid, None) for oid in OPTIMIZERS for tid in TREES]
    for oid, tid, dtype in cases + [(None, None, None)] + LOWP_CASES:
        if oid is None:  # the low-precision cases draw from their own generator
            rng = np.random.default_rng(20261127)
            continue
        opt = OPTIMIZERS[oid] if oid in OPTIMIZERS else LOWP_OPTIMIZERS[oid]
        update = jax.jit(opt.update)
        shapes = TREES[tid]
        dt = LOWP_DTYPES[dtype] if dtype else np.float32
        params = [(0.5 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
        params = [jnp.asarray(p).astype(dt) for p in params]
        state = opt.init(params)
        parts = parts_of(state)
        lines += [f"case {oid}.{tid}" + (f" {dtype}" if dtype else ""),
                  "parts " + " ".join(type(p).__name__ for p in parts)]
        lines += [f"param {k} {enc_leaf(p)}" for k, p in enumerate(params)]
        for t in range(1, STEPS + 1):
            grads = [jnp.asarray((GRAD_SCALES[t - 1] * rng.standard_normal(s))
                                 .astype(np.float32)).astype(dt) for s in shapes]
            updates, state = update(grads, state, params)
            params = optax.apply_updates(params, updates)
            lines.append(f"step {t}")
            lines += [f"grad {k} {enc_leaf(g)}" for k, g in enumerate(grads)]
            lines += [f"update {k} {enc_leaf(u)}" for k, u in enumerate(updates)]
            lines += [f"param {k} {enc_leaf(p)}" for k, p in enumerate(params)]
            for i, part in enumerate(parts_of(state)):
                for field in part._fields:
                    value = getattr(part, field)
                    if field == "count":
                        c = np.asarray(value)
                        assert c.dtype == np.int32 and c.shape == (), (c.dtype, c.shape)
                        lines.append(f"count {i} {int(c)}")
                    else:
                        lines += [f"slot {i} {field} {k} {enc_leaf(x)}"
                                  for k, x in enumerate(value)]
        lines.append("")
    with open(OUT_PATH, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {OUT_PATH}: {len(SCHEDULES)} schedules, "
          f"{len(cases)} float32 optimizer cases, {len(LOWP_CASES)} low-precision ones")


if __name__ == "__main__":
    main()
