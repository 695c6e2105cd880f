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
    parts <class>...                    the chain's per-transform states, flattened depth first
                                        (optax's nested tuples of NamedTuples): their class names
    param <k> <shape> <floats>          initial parameter leaf k (tree order)
    step <t>                            then, for step t = 1..STEPS:
    grad <k> <shape> <floats>             the gradient given to update (stored random values)
    update <k> <shape> <floats>           the updates update returned
    param <k> <shape> <floats>            optax.apply_updates(params, updates)
    count <part> <int>                    the int32 count of state part <part>, if it has one
    slot <part> <field> <k> <shape> <floats>   leaf k of field <field> (mu, nu, trace) of part

<shape>: comma list or `scalar`. Floats are float32 values written as the shortest decimal that
reads back as the same float32 (parse with strtof).
"""
import os

os.environ["JAX_PLATFORMS"] = "cpu"

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


def fmt(v):
    return np.format_float_scientific(np.float32(v), unique=True, trim="-")


def enc_shape(shape):
    return "scalar" if len(shape) == 0 else ",".join(map(str, shape))


def enc_leaf(x):
    x = np.asarray(x)
    assert x.dtype == np.float32, x.dtype
    return enc_shape(x.shape) + " " + " ".join(fmt(v) for v in x.reshape(-1))


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
    for oid, opt in OPTIMIZERS.items():
        update = jax.jit(opt.update)
        for tid, shapes in TREES.items():
            params = [(0.5 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
            params = [jnp.asarray(p) for p in params]
            state = opt.init(params)
            parts = parts_of(state)
            lines += [f"case {oid}.{tid}", "parts " + " ".join(type(p).__name__ for p in parts)]
            lines += [f"param {k} {enc_leaf(p)}" for k, p in enumerate(params)]
            for t in range(1, STEPS + 1):
                grads = [jnp.asarray((GRAD_SCALES[t - 1] * rng.standard_normal(s))
                                     .astype(np.float32)) for s in shapes]
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
          f"{len(OPTIMIZERS) * len(TREES)} optimizer cases")


if __name__ == "__main__":
    main()
