#!/usr/bin/env python3
"""Generates tests/data/global_view_expected.txt: what `jax.jit` of ONE op gives (values,
dtype, shape, result sharding spec) for inputs committed to NamedShardings on meshes with
Auto axes.  Conformance table for meshrt's global-view Array ops (no JAX at test time).

    pip install jax            # CPU jax/jaxlib
    python3 tests/data/gen_global_view.py          # writes tests/data/global_view_expected.txt

The script sets XLA_FLAGS=--xla_force_host_platform_device_count=8, JAX_PLATFORMS=cpu and
jax_enable_x64 itself.  Re-running it with the same JAX version gives the identical file.

File format (one record per case, a blank line between records, '#' lines are comments):

    case <id>
    mesh <comma shape> <comma names>         devices = the first prod(shape) devices, row-major
    op <name> [key=value ...]
    in <dtype> <comma shape|scalar> <spec> [pos|arange]       one per array input, in order
    out <dtype> <comma shape|scalar> <spec>
    values <flat row-major values>
    (out/values repeat for multi-output ops: split)

Spec: entries joined by '|'; an entry is an axis name, None, or '(a,b)'; '-' = P().
`in` specs are written exactly as passed; `out` specs drop trailing None entries.
Input k (0-based argument position), flat index i, t = (i*(2k+3) + k):
    default: v = (t % 11) - 5;  flag pos: v = (t % 11) + 1;  f32/f64: v * 0.25;  i32/i64: v
    bool: v = (t % 3 == 0);  flag arange: v = i (in the input dtype)
Param values: ints, floats (always written with '.', 'e', 'inf' or 'nan'; a Python float,
weakly typed), comma lists, `none`, specs (spec syntax above), dtype names.
"""
import math
import os
import sys
from collections import Counter

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "global_view_expected.txt")

DT = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "bool": np.bool_}
DT_NAME = {np.dtype(v): k for k, v in DT.items()}

M8 = ((8,), ("x",))
M42 = ((4, 2), ("x", "y"))
M222 = ((2, 2, 2), ("x", "y", "z"))
M3 = ((3,), ("x",))

_MESHES = {}


def get_mesh(m):
    if m not in _MESHES:
        sizes, names = m
        n = math.prod(sizes)
        mesh = jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(sizes),
                             devices=jax.devices()[:n])
        ids = [d.id for d in mesh.devices.flat]
        assert ids == list(range(n)), ids  # C++ side assumes row-major first-n devices
        _MESHES[m] = mesh
    return _MESHES[m]


# ---------------------------------------------------------------- encoding helpers

class Spec(tuple):
    """A PartitionSpec as a tuple of entries (None | 'x' | ('x','y'))."""


def S(*entries):
    return Spec(entries)


def enc_entry(e):
    if e is None:
        return "None"
    if isinstance(e, str):
        return e
    return "(" + ",".join(e) + ")"


def enc_spec(spec):
    return "-" if len(spec) == 0 else "|".join(enc_entry(e) for e in spec)


def id_spec(spec):
    return "P(" + ",".join(enc_entry(e) for e in spec) + ")"


def enc_shape(shape):
    return "scalar" if len(shape) == 0 else ",".join(map(str, shape))


def enc_param(v):
    if isinstance(v, Spec):
        return enc_spec(v)
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return fmt_float(v)
    if isinstance(v, str):
        return v
    if isinstance(v, (tuple, list)):
        return ",".join(str(int(x)) for x in v)
    raise TypeError(v)


def fmt_float(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    r = repr(float(v))
    assert "." in r or "e" in r, r
    return r


def norm_out_spec(sharding, ndim):
    if not isinstance(sharding, NamedSharding):
        if sharding.is_fully_replicated:
            return "-"
        raise RuntimeError(f"non-NamedSharding result {sharding}")
    spec = sharding.spec
    for attr in ("unreduced", "reduced"):
        assert not getattr(spec, attr, None), spec
    ents = []
    for e in tuple(spec):
        if isinstance(e, (tuple, list)):
            e = tuple(e)
            e = None if len(e) == 0 else (e[0] if len(e) == 1 else e)
        ents.append(e)
    while ents and ents[-1] is None:
        ents.pop()
    assert len(ents) <= ndim
    return enc_spec(ents)


def fmt_values(arr, dt):
    flat = np.asarray(arr).reshape(-1)
    if dt == "bool":
        return " ".join("1" if b else "0" for b in flat)
    if dt in ("i32", "i64"):
        return " ".join(str(int(v)) for v in flat)
    return " ".join(fmt_float(float(v)) for v in flat)


def make_input(k, dtype, shape, flag):
    n = math.prod(shape)
    i = np.arange(n, dtype=np.int64)
    t = i * (2 * k + 3) + k
    if flag == "arange":
        v = i.astype(DT[dtype])
    elif dtype == "bool":
        v = (t % 3) == 0
    else:
        base = (t % 11) + 1 if flag == "pos" else (t % 11) - 5
        if dtype in ("f32", "f64"):
            v = base.astype(np.float64) * 0.25
        else:
            v = base
        v = v.astype(DT[dtype])
    return v.reshape(shape)


# ---------------------------------------------------------------- ops

BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "equal", "not_equal",
          "less", "less_equal", "greater", "greater_equal"]
UNARY = ["neg", "exp", "log", "sin", "cos", "tanh", "sqrt", "relu", "seed_expr"]
REDUCE = ["sum", "mean", "max", "min", "argmax"]


def make_fn(op, p, mesh):
    if op in BINARY:
        return getattr(jnp, op)
    if op == "add_scalar":
        return lambda x: x + p["value"]
    if op == "mul_scalar":
        return lambda x: x * p["value"]
    if op == "rsub_scalar":
        return lambda x: p["value"] - x
    if op == "div_scalar":
        return lambda x: x / p["value"]
    if op == "neg":
        return jnp.negative
    if op in ("exp", "log", "sin", "cos", "tanh", "sqrt"):
        return getattr(jnp, op)
    if op == "relu":
        return jax.nn.relu
    if op == "seed_expr":
        return lambda x: 2 * jnp.sin(x) + 1
    if op == "where":
        return jnp.where
    if op in REDUCE:
        fn = getattr(jnp, op)
        return lambda x: fn(x, axis=p["axis"], keepdims=bool(p["keepdims"]))
    if op == "softmax":
        return lambda x: jax.nn.softmax(x, axis=p["axis"])
    if op == "log_softmax":
        return lambda x: jax.nn.log_softmax(x, axis=p["axis"])
    if op == "matmul":
        return jnp.matmul
    if op == "dot":
        return jnp.dot
    if op == "transpose":
        return lambda x: jnp.transpose(x, p["perm"])
    if op == "reshape":
        return lambda x: jnp.reshape(x, p["shape"])
    if op == "slice":
        return lambda x: lax.slice(x, p["start"], p["limit"], p["strides"])
    if op == "slice_in_dim":
        return lambda x: lax.slice_in_dim(x, p["start"], p["limit"], p["stride"], p["axis"])
    if op == "dynamic_slice_in_dim":
        return lambda x: lax.dynamic_slice_in_dim(x, p["start"], p["size"], p["axis"])
    if op == "row":
        return lambda x: x[p["index"]]
    if op == "concatenate":
        return lambda *xs: jnp.concatenate(xs, axis=p["axis"])
    if op == "stack":
        return lambda *xs: jnp.stack(xs, axis=p["axis"])
    if op == "split":
        return lambda x: tuple(jnp.split(x, p["sections"], axis=p["axis"]))
    if op == "squeeze":
        return lambda x: jnp.squeeze(x, axis=p["axes"])
    if op == "expand_dims":
        return lambda x: jnp.expand_dims(x, p["axis"])
    if op == "pad":
        w = p["widths"]
        pairs = [(w[2 * d], w[2 * d + 1]) for d in range(len(w) // 2)]
        return lambda x: jnp.pad(x, pairs, constant_values=p["value"])
    if op == "astype":
        return lambda x: x.astype(DT[p["dtype"]])
    if op == "constraint":
        s = NamedSharding(mesh, P(*p["spec"]))
        return lambda x: lax.with_sharding_constraint(x, s)
    if op == "sum_then_constraint":
        s = NamedSharding(mesh, P(*p["spec"]))
        return lambda x: lax.with_sharding_constraint(jnp.sum(x, axis=p["axis"]), s)
    if op == "multiply_then_sum":
        return lambda a, b: jnp.sum(a * b, axis=p["axis"])
    raise KeyError(op)


def family(op):
    if op in BINARY:
        return "binary"
    if op.endswith("_scalar"):
        return "scalar"
    if op in UNARY:
        return "unary"
    if op in REDUCE:
        return "reduce"
    if op in ("softmax", "log_softmax"):
        return "softmax"
    if op in ("matmul", "dot"):
        return "matmul/dot"
    if op in ("slice", "slice_in_dim", "dynamic_slice_in_dim", "row"):
        return "slice"
    if op in ("concatenate", "stack", "split"):
        return "concat/stack/split"
    if op in ("squeeze", "expand_dims"):
        return "squeeze/expand"
    if op in ("constraint", "sum_then_constraint"):
        return "constraint"
    return op


# ---------------------------------------------------------------- case list

CASES = {}


def In(dtype, shape, spec, flag=None):
    return (dtype, tuple(shape), Spec(spec), flag)


def add(op, params, mesh, *inputs):
    """params: list of (key, value)."""
    params = tuple(params)
    pstr = "".join(f".{k}={enc_param(v)}" for k, v in params)
    dts = {i[0] for i in inputs}
    ins = []
    for dt, shape, spec, flag in inputs:
        s = ("" if len(dts) == 1 else dt) + "[" + ",".join(map(str, shape)) + "]" + id_spec(spec)
        ins.append(s + ("!" + flag if flag else ""))
    cid = (f"{op}{pstr}@{'x'.join(map(str, mesh[0]))}:" + "+".join(ins)
           + ("_" + inputs[0][0] if len(dts) == 1 else ""))
    CASES[cid] = (op, params, mesh, tuple(inputs))


F = ["f32", "i32"]

# specs for 2-D (8,8)-like operands, per mesh
SP2 = {
    M8: [S(), S("x"), S(None, "x"), S("x", None)],
    M42: [S(), S("x"), S("y"), S(None, "x"), S(None, "y"), S("x", "y"), S("y", "x"), S(("x", "y")),
          S(None, ("x", "y")), S(("y", "x"))],
    M222: [S(), S("x"), S(("x", "y")), S("x", "y"), S(None, "z"), S(("x", "y", "z")),
           S("z", ("x", "y")), S(("z", "x"), "y")],
}
SP3_222 = [S(), S("x", "y", "z"), S(None, "y"), S(("x", "y"), None, "z"), S("z", None, ("x", "y")),
           S(None, None, "x")]

# binary pairs on (8,8)
PAIRS = {
    M8: [(S(), S()), (S("x"), S("x")), (S("x"), S()), (S(), S("x")), (S("x"), S(None, "x")),
         (S(None, "x"), S("x")), (S(None, "x"), S(None, "x")), (S("x", None), S(None, "x"))],
    M42: [(S("x", "y"), S("x", "y")), (S("x"), S("y")), (S("y"), S("x")), (S("x"), S(None, "y")),
          (S("x", "y"), S("y", "x")), (S(("x", "y")), S("x")), (S("x"), S(("x", "y"))),
          (S(("x", "y")), S(("y", "x"))), (S("x", "y"), S(None, "x")), (S(None, "x"), S("x", "y")),
          (S(("x", "y")), S(("x", "y"))), (S(("x", "y")), S("y"))],
    M222: [(S("x", "y"), S("x", "y")), (S(("x", "y")), S("z")), (S("x"), S(None, "x")),
           (S(("x", "y", "z")), S()), (S("z", "y"), S(None, "y"))],
}


def gen_binary():
    for op in BINARY:
        full = op in ("add", "multiply")
        for dt in F:
            pos = "pos" if op == "divide" else None
            sel = {M8: PAIRS[M8] if (full or dt == "f32") else PAIRS[M8][:5],
                   M42: PAIRS[M42] if full else PAIRS[M42][:5 if dt == "f32" else 2],
                   M222: PAIRS[M222] if full else PAIRS[M222][:2 if dt == "f32" else 0]}
            for m, pairs in sel.items():
                for a, b in pairs:
                    add(op, [], m, In(dt, (8, 8), a), In(dt, (8, 8), b, pos))
        # 3-D on the 3-axis mesh
        if op in ("add", "multiply", "maximum", "less", "divide"):
            pos = "pos" if op == "divide" else None
            for a, b in [(S("x", "y", "z"), S("x", "y", "z")), (S("x"), S(None, None, "x")),
                         (S(("x", "y")), S(None, "z"))]:
                add(op, [], M222, In("f32", (8, 4, 4), a), In("f32", (8, 4, 4), b, pos))
    # wider dtypes
    for op in ("add", "multiply", "divide", "subtract", "greater"):
        pos = "pos" if op == "divide" else None
        for dt in ("f64", "i64"):
            for m, a, b in [(M8, S("x"), S("x")), (M8, S("x"), S(None, "x")), (M42, S("x", "y"), S("y"))]:
                add(op, [], m, In(dt, (8, 8), a), In(dt, (8, 8), b, pos))
    # mixed dtypes (promotion)
    for op in ("add", "multiply", "divide"):
        pos = "pos" if op == "divide" else None
        for da, db in [("f32", "i32"), ("i32", "f32"), ("f32", "f64"), ("i32", "i64")]:
            add(op, [], M8, In(da, (8, 8), S("x")), In(db, (8, 8), S("x"), pos))
    # shape (8,4) / (16,8)
    for op in ("add", "subtract", "multiply", "divide", "maximum", "less"):
        pos = "pos" if op == "divide" else None
        for dt in F:
            add(op, [], M8, In(dt, (8, 4), S("x")), In(dt, (8, 4), S("x"), pos))
            add(op, [], M8, In(dt, (8, 4), S("x")), In(dt, (8, 4), S(), pos))
            add(op, [], M8, In(dt, (16, 8), S("x")), In(dt, (16, 8), S(None, "x"), pos))
            add(op, [], M42, In(dt, (16, 8), S("x", "y")), In(dt, (16, 8), S(("x", "y")), pos))


def gen_broadcast():
    shapes = [
        (M8, (8, 4), S("x"), (4,), S()),
        (M8, (8, 4), S("x"), (8, 1), S("x")),
        (M8, (8, 4), S("x"), (8, 1), S()),
        (M8, (8, 4), S(), (8, 1), S("x")),
        (M8, (8, 8), S("x"), (8,), S("x")),
        (M8, (8, 8), S(None, "x"), (8,), S("x")),
        (M8, (8, 8), S(None, "x"), (8, 1), S("x")),
        (M8, (8, 1), S("x"), (1, 8), S(None, "x")),
        (M8, (8, 4), S("x"), (), S()),
        (M8, (8, 8), S(None, "x"), (), S()),
        (M8, (8, 4), S("x"), (1,), S()),
        (M42, (8, 4), S("x", "y"), (4,), S("y")),
        (M42, (8, 4), S("x", "y"), (4,), S("x")),
        (M42, (8, 4), S("x", "y"), (8, 1), S("x")),
        (M42, (8, 4), S(("x", "y")), (8, 1), S("y")),
        (M42, (8, 8), S("x"), (8,), S("y")),
        (M222, (8, 4, 4), S("x", "y", "z"), (4, 4), S("y", "z")),
        (M222, (8, 4, 4), S("x", "y"), (4,), S("z")),
        (M222, (8, 4, 4), S("x"), (8, 1, 1), S("y")),
    ]
    for op in ("add", "subtract", "multiply", "divide", "maximum", "greater"):
        pos = "pos" if op == "divide" else None
        for dt in F:
            if dt == "i32" and op not in ("add", "multiply", "greater"):
                continue
            for m, sa, pa, sb, pb in shapes:
                add(op, [], m, In(dt, sa, pa), In(dt, sb, pb, pos))
                if op in ("add", "subtract", "greater") or dt == "f32" and op == "multiply":
                    # reversed order (the broadcast operand first); divisor keeps pos
                    add(op, [], m, In(dt, sb, pb), In(dt, sa, pa, pos))


def gen_scalar():
    specs = [(M8, S()), (M8, S("x")), (M8, S(None, "x")), (M42, S("x", "y")), (M42, S(("x", "y"))),
             (M222, S("z", ("x", "y")))]
    for op, vals in [("add_scalar", [1.5, -2.0]), ("mul_scalar", [2.0, -0.5]),
                     ("rsub_scalar", [1.0, 3.25]), ("div_scalar", [2.0, 0.5])]:
        for m, s in specs:
            add(op, [("value", vals[0])], m, In("f32", (8, 8), s))
        add(op, [("value", vals[1])], M8, In("f32", (8, 8), S("x")))
        add(op, [("value", vals[0])], M8, In("f64", (8, 8), S("x")))
        add(op, [("value", vals[0])], M42, In("f32", (8, 4), S("x", "y")))
        # int V on i32, and float V on i32 (promotes)
        for m, s in [(M8, S("x")), (M42, S("x", "y")), (M8, S())]:
            add(op, [("value", 2)], m, In("i32", (8, 8), s))
        add(op, [("value", -3)], M8, In("i32", (8, 8), S(None, "x")))
        add(op, [("value", vals[0])], M8, In("i32", (8, 8), S("x")))
        add(op, [("value", 2)], M8, In("f32", (8, 8), S("x")))
        add(op, [("value", 2)], M8, In("i64", (8, 8), S("x")))


def gen_unary():
    specs = [(M8, S()), (M8, S("x")), (M8, S(None, "x")), (M42, S("x", "y")), (M42, S(("x", "y"))),
             (M222, S("z", ("x", "y")))]
    for op in UNARY:
        pos = "pos" if op in ("log", "sqrt") else None
        for m, s in specs:
            add(op, [], m, In("f32", (8, 8), s, pos))
        add(op, [], M8, In("f64", (8, 8), S("x"), pos))
        add(op, [], M222, In("f32", (8, 4, 4), S("x", "y", "z"), pos))
        for m, s in [(M8, S("x")), (M42, S("y", "x"))]:
            add(op, [], m, In("i32", (8, 8), s, pos))
        add(op, [], M8, In("f32", (16, 8), S("x"), pos))
        add(op, [], M8, In("f32", (8,), S("x"), pos))
    for op in ("neg", "relu"):
        add(op, [], M8, In("i64", (8, 8), S("x")))
        add(op, [], M8, In("i32", (8, 8), S()))


def gen_where():
    trip = [
        (M8, (8, 8), S("x"), S("x"), S("x")),
        (M8, (8, 8), S(), S("x"), S("x")),
        (M8, (8, 8), S("x"), S(None, "x"), S()),
        (M8, (8, 8), S(None, "x"), S("x"), S("x")),
        (M8, (8, 8), S("x"), S("x"), S(None, "x")),
        (M42, (8, 8), S("x", "y"), S("x", "y"), S("x", "y")),
        (M42, (8, 8), S("x", "y"), S("y"), S("x")),
        (M42, (8, 8), S(("x", "y")), S("x"), S()),
        (M42, (8, 8), S("x"), S(None, "y"), S()),
        (M222, (8, 4, 4), S("x", "y", "z"), S("x", "y", "z"), S()),
        (M222, (8, 4, 4), S("x"), S(None, "y"), S(None, None, "z")),
    ]
    for dt in F:
        for m, shape, pc, pa, pb in trip:
            add("where", [], m, In("bool", shape, pc), In(dt, shape, pa), In(dt, shape, pb))
    # broadcasting where
    add("where", [], M8, In("bool", (8, 1), S("x")), In("f32", (8, 4), S("x")), In("f32", (4,), S()))
    add("where", [], M8, In("bool", (8, 4), S("x")), In("f32", (), S()), In("f32", (8, 4), S()))
    add("where", [], M42, In("bool", (8, 4), S("x", "y")), In("f32", (4,), S("y")),
        In("f32", (8, 1), S("x")))


def gen_reduce():
    s2 = [(M8, S()), (M8, S("x")), (M8, S(None, "x")), (M42, S("x", "y")), (M42, S(("x", "y"))),
          (M42, S("y", "x")), (M222, S("z", ("x", "y")))]
    for op in REDUCE:
        for m, s in s2:
            for ax in (0, 1, None):
                add(op, [("axis", ax), ("keepdims", 0)], m, In("f32", (8, 8), s))
        for m, s in [(M8, S("x")), (M42, S("x", "y"))]:
            for ax in (0, 1, None):
                add(op, [("axis", ax), ("keepdims", 1)], m, In("f32", (8, 8), s))
        add(op, [("axis", -1), ("keepdims", 0)], M8, In("f32", (8, 8), S(None, "x")))
        add(op, [("axis", -1), ("keepdims", 1)], M42, In("f32", (8, 8), S("x", "y")))
        for m, s in [(M8, S("x")), (M8, S(None, "x")), (M42, S("x", "y"))]:
            for ax in (0, 1, None):
                add(op, [("axis", ax), ("keepdims", 0)], m, In("i32", (8, 8), s))
        add(op, [("axis", 0), ("keepdims", 1)], M8, In("i32", (8, 8), S("x")))
        for ax in (0, 1, 2, None):
            add(op, [("axis", ax), ("keepdims", 0)], M222, In("f32", (8, 4, 4), S("x", "y", "z")))
        add(op, [("axis", 1), ("keepdims", 1)], M222, In("f32", (8, 4, 4), S(("x", "y"), "z")))
        for ax in (0, 1):
            add(op, [("axis", ax), ("keepdims", 0)], M8, In("f32", (8, 4), S("x")))
        add(op, [("axis", 0), ("keepdims", 0)], M8, In("f32", (8,), S("x")))
        add(op, [("axis", None), ("keepdims", 0)], M8, In("f64", (8, 8), S("x")))
        add(op, [("axis", 0), ("keepdims", 0)], M8, In("i64", (8, 8), S("x")))
    # sum/max of bool
    add("sum", [("axis", 0), ("keepdims", 0)], M8, In("bool", (8, 8), S("x")))
    add("argmax", [("axis", 1), ("keepdims", 0)], M8, In("bool", (8, 8), S("x")))


def gen_softmax():
    for op in ("softmax", "log_softmax"):
        for m, shape, s in [(M8, (8, 8), S()), (M8, (8, 8), S("x")), (M8, (8, 8), S(None, "x")),
                            (M8, (8, 4), S("x")), (M42, (8, 8), S("x", "y")),
                            (M42, (8, 8), S(("x", "y")))]:
            for ax in (0, 1, -1):
                add(op, [("axis", ax)], m, In("f32", shape, s))
        for ax in (0, 1, 2):
            add(op, [("axis", ax)], M222, In("f32", (8, 4, 4), S("x", "y", "z")))
        add(op, [("axis", -1)], M8, In("f64", (8, 8), S("x")))
        add(op, [("axis", 1)], M8, In("i32", (8, 8), S("x")))


def gen_matmul():
    mm2 = [
        (M8, (8, 16), S("x", None), (16, 4), S()),
        (M8, (8, 16), S(), (16, 8), S(None, "x")),
        (M8, (8, 16), S(None, "x"), (16, 8), S("x", None)),
        (M8, (8, 16), S(None, "x"), (16, 8), S()),
        (M8, (8, 16), S(), (16, 8), S("x", None)),
        (M8, (8, 16), S("x", None), (16, 8), S(None, "x")),
        (M8, (8, 16), S("x", None), (16, 64), S(None, "x")),
        (M8, (8, 16), S("x", None), (16, 8), S("x", None)),
        (M8, (8, 16), S(None, "x"), (16, 8), S(None, "x")),
        (M8, (64, 16), S(None, "x"), (16, 8), S(None, "x")),
        (M8, (8, 8), S("x"), (8, 8), S("x")),
        (M8, (8, 8), S(), (8, 8), S()),
        (M42, (8, 16), S("x", None), (16, 8), S(None, "y")),
        (M42, (8, 16), S("x", "y"), (16, 8), S("y", None)),
        (M42, (8, 16), S(None, "x"), (16, 8), S("y", None)),
        (M42, (8, 16), S(None, ("x", "y")), (16, 8), S(("x", "y"), None)),
        (M42, (8, 16), S("x", "y"), (16, 8), S(None, "y")),
        (M42, (8, 16), S("x", None), (16, 8), S("y", None)),
        (M42, (8, 16), S("x", None), (16, 8), S("x", "y")),
        (M42, (8, 8), S(("x", "y")), (8, 8), S()),
        (M42, (8, 8), S("y", "x"), (8, 8), S("x", "y")),
        (M222, (8, 8), S("x", "y"), (8, 8), S("y", "z")),
        (M222, (8, 8), S(("x", "y"), "z"), (8, 8), S("z", None)),
    ]
    for m, sa, pa, sb, pb in mm2:
        add("matmul", [], m, In("f32", sa, pa), In("f32", sb, pb))
        add("dot", [], m, In("f32", sa, pa), In("f32", sb, pb))
    for m, sa, pa, sb, pb in mm2[:6] + mm2[12:16]:
        add("matmul", [], m, In("i32", sa, pa), In("i32", sb, pb))
    add("matmul", [], M8, In("f64", (8, 16), S("x")), In("f64", (16, 8), S()))
    add("matmul", [], M8, In("f32", (8, 16), S("x")), In("i32", (16, 8), S()))
    # batched
    bat = [
        (M8, S("x"), S("x")), (M8, S("x"), S()), (M8, S(), S()), (M8, S("x"), S(None, None, "x")),
        (M8, S(None, "x"), S()), (M8, S(None, None, "x"), S(None, "x")),
        (M42, S("x"), S("y")), (M42, S("x", "y"), S("x")), (M42, S("x"), S("x", None, "y")),
        (M42, S("x", "y"), S("x", "y")),
        (M222, S("x", "y"), S("x", None, "z")), (M222, S("x", "y", "z"), S("x", "z", "y")),
    ]
    for m, pa, pb in bat:  # batch 8 on the 8-device mesh so P(x) divides
        b = (8, 8, 8) if m == M8 else (4, 8, 8)
        add("matmul", [], m, In("f32", b, pa), In("f32", b, pb))
    for m, pa, pb in bat[:2] + bat[6:8]:
        b = (8, 8, 8) if m == M8 else (4, 8, 8)
        add("matmul", [], m, In("i32", b, pa), In("i32", b, pb))
    add("matmul", [], M8, In("f32", (8, 4, 8), S("x")), In("f32", (8, 8), S()))
    add("matmul", [], M8, In("f32", (8, 4, 8), S("x")), In("f32", (8, 8), S(None, "x")))
    add("matmul", [], M42, In("f32", (8, 4, 8), S("x", None, "y")), In("f32", (8, 8), S("y")))
    # dot: vector forms
    dv = [
        (M8, (16,), S("x"), (16,), S("x")),
        (M8, (16,), S("x"), (16,), S()),
        (M8, (16,), S(), (16,), S()),
        (M42, (16,), S("x"), (16,), S("y")),
        (M42, (16,), S(("x", "y")), (16,), S(("x", "y"))),
        (M8, (8, 16), S("x"), (16,), S()),
        (M8, (8, 16), S(None, "x"), (16,), S("x")),
        (M8, (8, 16), S("x"), (16,), S("x")),
        (M8, (8, 16), S(), (16,), S("x")),
        (M42, (8, 16), S("x", "y"), (16,), S("y")),
        (M42, (8, 16), S("x", "y"), (16,), S("x")),
        (M222, (8, 16), S(("x", "y"), "z"), (16,), S("z")),
    ]
    for m, sa, pa, sb, pb in dv:
        for dt in F:
            add("dot", [], m, In(dt, sa, pa), In(dt, sb, pb))
    for m, sa, pa, sb, pb in mm2[:4]:
        add("dot", [], m, In("i32", sa, pa), In("i32", sb, pb))
    add("matmul", [], M8, In("f32", (8, 16), S("x")), In("f32", (16,), S()))
    add("matmul", [], M8, In("f32", (16,), S("x")), In("f32", (16, 8), S("x")))


def gen_layout():
    # transpose
    for dt in F:
        for m, shape, s, perm in [
            (M8, (8, 8), S("x", None), (1, 0)), (M8, (8, 8), S(None, "x"), (1, 0)),
            (M8, (8, 8), S(), (1, 0)), (M8, (8, 8), S("x"), None), (M8, (16, 8), S("x"), (1, 0)),
            (M8, (4, 8, 2), S(None, "x", None), (2, 0, 1)), (M8, (4, 8, 2), S(None, "x"), None),
            (M42, (8, 8), S("x", "y"), (1, 0)), (M42, (8, 8), S(("x", "y")), (1, 0)),
            (M42, (8, 4, 4), S("x", None, "y"), (1, 2, 0)),
            (M222, (8, 4, 4), S("x", "y", "z"), (2, 1, 0)), (M222, (8, 4, 4), S(("x", "y"), "z"), None),
            (M222, (8, 4, 4), S("x", "y", "z"), (0, 2, 1)),
        ]:
            if dt == "i32" and m != M8 and perm != (1, 0):
                continue
            add("transpose", [("perm", perm)], m, In(dt, shape, s))
    # reshape
    rs = [
        (M8, (8, 4), S("x"), (32,)), (M8, (32,), S("x"), (8, 4)), (M8, (64,), S("x"), (16, 4)),
        (M8, (16, 4), S("x"), (8, 2, 4)), (M8, (8, 6), S("x"), (8, 2, 3)), (M8, (8, 2, 3), S("x"), (8, 6)),
        (M8, (16, 4), S("x"), (2, 8, 4)), (M8, (8, 4), S("x"), (4, 8)), (M8, (8, 4), S("x"), (2, 4, 4)),
        (M8, (8, 4), S("x"), (4, 2, 4)), (M8, (32,), S("x"), (4, 8)), (M8, (4, 8), S(None, "x"), (32,)),
        (M8, (8, 8), S(), (4, 2, 8)), (M8, (8, 8), S("x"), (4, 2, 8)), (M8, (8, 8), S(None, "x"), (4, 2, 8)),
        (M8, (8, 8), S("x"), (64,)), (M8, (8, 8), S("x"), (8, 2, 4)), (M8, (8, 8), S(None, "x"), (8, 2, 4)),
        (M8, (16, 8), S("x"), (8, 16)), (M8, (16, 8), S("x"), (128,)), (M8, (8, 4, 4), S("x"), (8, 16)),
        (M8, (8, 4, 4), S("x"), (32, 4)), (M8, (8, 8), S("x"), (8, 8, 1)), (M8, (8, 8), S("x"), (1, 64)),
        (M42, (8, 4), S("x"), (4, 2, 4)), (M42, (8, 4), S("x"), (2, 4, 4)),
        (M42, (8, 4), S(("x", "y")), (4, 2, 4)), (M42, (32,), S(("x", "y")), (4, 8)),
        (M42, (4, 2, 4), S("x", "y"), (8, 4)), (M42, (8, 4), S("x", "y"), (32,)),
        (M42, (8, 8), S("x", "y"), (4, 2, 8)), (M42, (8, 8), S("x", "y"), (64,)),
        (M42, (8, 8), S("y", "x"), (64,)), (M42, (8, 8), S(None, ("x", "y")), (8, 2, 4)),
        (M222, (8, 4, 4), S("x", "y", "z"), (8, 16)), (M222, (8, 4, 4), S("x", "y", "z"), (2, 4, 16)),
        (M222, (8, 4, 4), S(("x", "y", "z")), (128,)), (M222, (8, 8), S(("x", "y", "z")), (2, 2, 2, 8)),
    ]
    for m, shape, s, ns in rs:
        add("reshape", [("shape", ns)], m, In("f32", shape, s))
    for m, shape, s, ns in rs[:8] + rs[24:30]:
        add("reshape", [("shape", ns)], m, In("i32", shape, s))
    # squeeze / expand_dims
    for dt in F:
        for m, shape, s, axes in [
            (M8, (8, 1, 4), S("x"), (1,)), (M8, (8, 1, 4), S("x"), None), (M8, (1, 8), S(None, "x"), (0,)),
            (M8, (1, 8), S(None, "x"), None), (M8, (1, 8, 1), S(None, "x"), (0, 2)),
            (M8, (8, 1), S("x"), (1,)), (M8, (1, 8, 1), S(), None),
            (M42, (8, 1, 4), S("x", None, "y"), (1,)), (M42, (1, 8, 4), S(None, ("x", "y")), None),
            (M222, (8, 1, 4, 1), S(("x", "y"), None, "z"), None),
        ]:
            add("squeeze", [("axes", axes)], m, In(dt, shape, s))
        for m, shape, s, ax in [
            (M8, (8, 4), S("x"), 0), (M8, (8, 4), S("x"), 1), (M8, (8, 4), S("x"), 2),
            (M8, (8, 4), S("x"), -1), (M8, (4, 8), S(None, "x"), 0), (M8, (8,), S("x"), 0),
            (M8, (8,), S("x"), 1), (M42, (8, 4), S("x", "y"), 1), (M42, (8, 4), S(("x", "y")), 0),
            (M222, (8, 4, 4), S("x", "y", "z"), 3), (M222, (8, 4, 4), S("x", "y", "z"), 1),
        ]:
            add("expand_dims", [("axis", ax)], m, In(dt, shape, s))
    # astype
    for m, shape, s in [(M8, (8, 8), S("x")), (M8, (8, 8), S(None, "x")), (M42, (8, 8), S("x", "y"))]:
        for src, dst in [("f32", "i32"), ("i32", "f32"), ("f32", "f64"), ("f64", "f32"), ("f32", "bool"),
                         ("bool", "f32"), ("i32", "i64"), ("i64", "i32"), ("bool", "i32"), ("i32", "bool"),
                         ("f32", "f32")]:
            if m != M8 and (src, dst) not in (("f32", "i32"), ("i32", "f32"), ("bool", "f32")):
                continue
            add("astype", [("dtype", dst)], m, In(src, shape, s))


def gen_slice():
    for dt in F:
        for m, shape, s, start, limit, strides in [
            (M8, (8, 4), S("x"), (0, 0), (4, 4), None), (M8, (8, 4), S("x"), (1, 0), (8, 4), None),
            (M8, (16, 4), S("x"), (0, 0), (8, 4), None), (M8, (16, 4), S("x"), (8, 0), (16, 4), None),
            (M8, (16, 4), S("x"), (0, 0), (16, 4), (2, 1)), (M8, (8, 4), S("x"), (0, 0), (8, 2), None),
            (M8, (8, 8), S(None, "x"), (0, 0), (8, 4), None), (M8, (8, 8), S(None, "x"), (2, 0), (6, 8), None),
            (M8, (8, 8), S(), (1, 1), (7, 7), (2, 3)), (M8, (8, 8), S("x"), (0, 0), (8, 8), None),
            (M8, (16, 8), S("x"), (1, 0), (16, 8), (2, 1)), (M8, (16, 8), S("x"), (0, 0), (16, 8), (2, 2)),
            (M42, (8, 8), S("x", "y"), (0, 0), (4, 4), None), (M42, (8, 8), S("x", "y"), (0, 0), (8, 4), None),
            (M42, (16, 8), S(("x", "y")), (0, 0), (8, 8), None),
            (M42, (16, 8), S("x", "y"), (0, 0), (16, 8), (2, 2)),
            (M222, (8, 4, 4), S("x", "y", "z"), (0, 0, 0), (4, 4, 2), None),
            (M222, (8, 4, 4), S("x", "y", "z"), (0, 1, 0), (8, 3, 4), None),
        ]:
            add("slice", [("start", start), ("limit", limit), ("strides", strides)], m, In(dt, shape, s))
        for m, shape, s, st, li, sd, ax in [
            (M8, (8, 4), S("x"), 0, 4, 1, 0), (M8, (16, 4), S("x"), 0, 8, 1, 0),
            (M8, (16, 4), S("x"), 0, 16, 2, 0), (M8, (8, 4), S("x"), 0, 2, 1, 1),
            (M8, (8, 8), S(None, "x"), 2, 6, 1, 1), (M8, (8, 8), S(None, "x"), 0, 4, 1, 0),
            (M8, (8, 8), S("x"), 1, 8, 2, 0), (M42, (8, 8), S("x", "y"), 0, 4, 1, 1),
            (M42, (16, 8), S(("x", "y")), 8, 16, 1, 0), (M222, (8, 4, 4), S("x", "y", "z"), 0, 2, 1, 2),
        ]:
            add("slice_in_dim", [("start", st), ("limit", li), ("stride", sd), ("axis", ax)], m,
                In(dt, shape, s))
        for m, shape, s, st, sz, ax in [
            (M8, (8, 8), S("x"), 2, 4, 0), (M8, (16, 4), S("x"), 4, 8, 0), (M8, (8, 4), S("x"), 1, 2, 1),
            (M8, (8, 8), S(None, "x"), 0, 4, 0), (M8, (8, 8), S(None, "x"), 3, 5, 1),
            (M8, (16, 8), S("x"), 0, 8, 0), (M8, (8, 8), S(), 2, 4, 0),
            (M42, (8, 8), S("x", "y"), 4, 4, 0), (M42, (8, 8), S("x", "y"), 2, 4, 1),
            (M222, (8, 4, 4), S("x", "y", "z"), 1, 2, 1),
        ]:
            add("dynamic_slice_in_dim", [("start", st), ("size", sz), ("axis", ax)], m, In(dt, shape, s))
        for m, shape, s, idx in [
            (M8, (8, 4), S("x"), 0), (M8, (8, 4), S("x"), 3), (M8, (8, 8), S(None, "x"), 3),
            (M8, (8, 8), S(), 5), (M8, (16, 8), S("x"), 9), (M8, (4, 8, 8), S(None, "x"), 2),
            (M8, (8, 4, 4), S("x"), 1), (M42, (8, 8), S("x", "y"), 3), (M42, (4, 8, 8), S("x", "y"), 0),
            (M42, (4, 8, 8), S(None, "x", "y"), 3), (M222, (8, 4, 4), S("x", "y", "z"), 7),
        ]:
            add("row", [("index", idx)], m, In(dt, shape, s))


def gen_concat():
    for dt in F:
        for m, shape, specs, ax in [
            (M8, (8, 4), [S("x"), S("x")], 0), (M8, (8, 4), [S("x"), S()], 0),
            (M8, (8, 4), [S("x"), S("x")], 1), (M8, (8, 4), [S(), S("x")], 1),
            (M8, (8, 8), [S(None, "x"), S("x")], 0), (M8, (8, 8), [S("x"), S(None, "x")], 1),
            (M8, (8, 8), [S(None, "x"), S(None, "x")], 0), (M8, (8, 8), [S(), S()], 0),
            (M8, (8, 4), [S("x"), S("x"), S("x")], 1), (M8, (8, 4), [S("x"), S(), S("x")], 0),
            (M8, (8, 4), [S("x"), S("x")], -1),
            (M42, (8, 4), [S("x", "y"), S("x", "y")], 0), (M42, (8, 4), [S("x", "y"), S("x", "y")], 1),
            (M42, (8, 4), [S("x"), S("y")], 1), (M42, (8, 8), [S(("x", "y")), S("x")], 1),
            (M42, (8, 4), [S("x", "y"), S("x"), S(None, "y")], 1),
            (M222, (8, 4, 4), [S("x", "y", "z"), S("x", "y", "z")], 2),
            (M222, (8, 4, 4), [S("x", "y", "z"), S("x")], 0),
        ]:
            add("concatenate", [("axis", ax)], m, *[In(dt, shape, s) for s in specs])
        add("concatenate", [("axis", 0)], M8, In(dt, (8, 4), S("x")), In(dt, (16, 4), S("x")))
        add("concatenate", [("axis", 0)], M8, In(dt, (2, 4), S()), In(dt, (8, 4), S("x")))
        add("concatenate", [("axis", 1)], M8, In(dt, (8, 4), S("x")), In(dt, (8, 2), S("x")),
            In(dt, (8, 1), S()))
        for m, shape, specs, ax in [
            (M8, (8, 4), [S("x"), S("x")], 0), (M8, (8, 4), [S("x"), S("x")], 1),
            (M8, (8, 4), [S("x"), S("x")], 2), (M8, (8, 4), [S("x"), S()], 0),
            (M8, (8, 8), [S("x"), S(None, "x")], 0), (M8, (8, 4), [S("x"), S("x"), S("x")], 0),
            (M8, (8,), [S("x"), S("x")], 1), (M8, (8, 4), [S("x"), S("x")], -1),
            (M42, (8, 4), [S("x", "y"), S("x", "y")], 0), (M42, (8, 4), [S("x"), S("y")], 1),
            (M42, (8, 4), [S(("x", "y")), S("x")], 2),
            (M222, (8, 4, 4), [S("x", "y", "z"), S("x", "y", "z")], 3),
        ]:
            add("stack", [("axis", ax)], m, *[In(dt, shape, s) for s in specs])
        for m, shape, s, n, ax in [
            (M8, (16, 4), S("x"), 2, 0), (M8, (16, 4), S("x"), 2, 1), (M8, (16, 4), S("x"), 4, 0),
            (M8, (8, 8), S("x"), 2, 0), (M8, (8, 8), S("x"), 4, 1), (M8, (8, 8), S(None, "x"), 2, 1),
            (M8, (8, 8), S(None, "x"), 2, 0), (M8, (8, 8), S(), 8, 0), (M8, (8, 8), S("x"), 2, -1),
            (M42, (8, 8), S("x", "y"), 2, 0), (M42, (8, 8), S("x", "y"), 2, 1),
            (M42, (16, 8), S(("x", "y")), 2, 0), (M222, (8, 4, 4), S("x", "y", "z"), 2, 2),
        ]:
            add("split", [("sections", n), ("axis", ax)], m, In(dt, shape, s))


def gen_pad():
    for dt in F:
        v1 = 1.5 if dt == "f32" else 7
        for m, shape, s, w, v in [
            (M8, (8, 4), S("x"), (1, 1, 0, 0), 0.0), (M8, (8, 4), S("x"), (0, 8, 0, 0), 0.0),
            (M8, (8, 4), S("x"), (0, 0, 1, 1), v1), (M8, (8, 4), S("x"), (0, 0, 0, 4), 0.0),
            (M8, (8, 8), S(None, "x"), (1, 1, 0, 0), v1), (M8, (8, 8), S(None, "x"), (0, 0, 4, 4), 0.0),
            (M8, (8, 8), S(), (1, 2, 3, 4), v1), (M8, (8, 8), S("x"), (0, 0, 0, 0), 0.0),
            (M8, (6, 4), S(), (1, 1, 0, 0), 0.0), (M8, (8, 4), S("x"), (8, 0, 2, 2), -1.0),
            (M42, (8, 8), S("x", "y"), (1, 1, 0, 0), 0.0), (M42, (8, 8), S("x", "y"), (0, 0, 0, 2), v1),
            (M42, (8, 8), S("x", "y"), (4, 4, 1, 1), 0.0), (M42, (8, 4), S(("x", "y")), (0, 8, 0, 0), 0.0),
            (M222, (8, 4, 4), S("x", "y", "z"), (0, 0, 2, 2, 1, 1), 0.0),
            (M222, (8, 4, 4), S("x", "y", "z"), (0, 8, 0, 0, 0, 0), v1),
        ]:
            if dt == "i32" and isinstance(v, float):
                v = int(v)
            add("pad", [("widths", w), ("value", v)], m, In(dt, shape, s))
    add("pad", [("widths", (1, 1, 0, 0)), ("value", 0.5)], M8, In("f64", (8, 4), S("x")))
    add("pad", [("widths", (0, 0, 1, 1)), ("value", 2)], M8, In("f32", (8, 4), S("x")))


def gen_constraint():
    cons = [
        (M8, (8, 8), S("x"), S(None, "x")), (M8, (8, 8), S("x"), S()), (M8, (8, 8), S(), S("x")),
        (M8, (8, 8), S(None, "x"), S("x")), (M8, (8, 8), S("x"), S("x")), (M8, (8, 4), S(), S("x")),
        (M8, (6, 4), S(), S("x")), (M8, (12, 4), S(), S("x")), (M8, (8, 4), S("x"), S(None, "x")),
        (M8, (16, 8), S("x"), S(None, "x")), (M8, (8,), S(), S("x")), (M8, (10,), S(), S("x")),
        (M42, (8, 8), S("x"), S("y")), (M42, (8, 8), S("x", "y"), S("y", "x")),
        (M42, (8, 8), S(("x", "y")), S(("y", "x"))), (M42, (8, 8), S(("x", "y")), S("x")),
        (M42, (8, 8), S("x"), S(("x", "y"))), (M42, (8, 8), S(), S("x", "y")),
        (M42, (8, 8), S("x", "y"), S()), (M42, (6, 4), S(), S("x", "y")), (M42, (8, 6), S("x"), S("x", "y")),
        (M42, (8, 8), S("x", "y"), S(None, ("x", "y"))), (M42, (4, 8), S(), S(("x", "y"))),
        (M222, (8, 4, 4), S("x", "y", "z"), S("z", "y", "x")), (M222, (8, 4, 4), S(), S(("x", "y", "z"))),
        (M222, (8, 4, 4), S("x"), S(None, ("y", "z"))), (M222, (8, 6, 4), S(), S("x", "y", "z")),
    ]
    for dt in F:
        for m, shape, s, t in cons:
            if dt == "i32" and m == M222 and t != S("z", "y", "x"):
                continue
            add("constraint", [("spec", t)], m, In(dt, shape, s))
    add("constraint", [("spec", S("x"))], M8, In("bool", (8, 8), S(None, "x")))
    for dt in F:
        for m, shape, s, ax, t in [
            (M8, (8, 8), S("x"), 0, S("x")), (M8, (8, 8), S("x"), 1, S()), (M8, (8, 8), S("x"), 0, S()),
            (M8, (8, 8), S(None, "x"), 0, S("x")), (M8, (8, 8), S(None, "x"), 1, S("x")),
            (M8, (8, 4), S("x"), 0, S("x")), (M8, (16, 8), S("x"), 1, S("x")),
            (M8, (8, 16), S("x"), 0, S("x")), (M8, (8, 8), S(), 0, S("x")),
            (M42, (8, 8), S("x", "y"), 0, S("y")), (M42, (8, 8), S("x", "y"), 0, S("x")),
            (M42, (8, 8), S("x", "y"), 1, S(("x", "y"))), (M42, (8, 8), S(("x", "y")), 0, S(("x", "y"))),
            (M222, (8, 4, 4), S("x", "y", "z"), 0, S("y", "z")),
            (M222, (8, 4, 4), S("x", "y", "z"), 2, S(("x", "z"), "y")),
        ]:
            if dt == "i32" and m != M8:
                continue
            add("sum_then_constraint", [("axis", ax), ("spec", t)], m, In(dt, shape, s))
    for dt in F:
        for m, shape, pa, pb in [
            (M8, (8, 8), S("x"), S("x")), (M8, (8, 8), S("x"), S(None, "x")), (M8, (8, 8), S(), S()),
            (M8, (16,), S("x"), S("x")), (M42, (8, 8), S("x", "y"), S("x", "y")),
            (M42, (8, 8), S("x"), S("y")), (M222, (8, 4, 4), S("x", "y", "z"), S("x", "y", "z")),
        ]:
            add("multiply_then_sum", [("axis", None)], m, In(dt, shape, pa), In(dt, shape, pb))


def gen_seed():
    for shape in ((3, 8), (3, 12)):
        x = In("f32", shape, S("x"), "arange")
        add("seed_expr", [], M3, x)
        add("sum", [("axis", 0), ("keepdims", 0)], M3, x)
        add("sum", [("axis", 1), ("keepdims", 0)], M3, x)
        add("sum_then_constraint", [("axis", 0), ("spec", S("x"))], M3, x)


# ---------------------------------------------------------------- run

def run_case(op, params, mesh_key, inputs):
    mesh = get_mesh(mesh_key)
    p = dict(params)
    args = []
    for k, (dt, shape, spec, flag) in enumerate(inputs):
        v = make_input(k, dt, shape, flag)
        args.append(jax.device_put(v, NamedSharding(mesh, P(*spec))))
    f = make_fn(op, p, mesh)
    out = jax.jit(f)(*args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    lines = []
    for o in outs:
        o.block_until_ready()
        dt = DT_NAME[np.dtype(o.dtype)]
        lines.append(f"out {dt} {enc_shape(o.shape)} {norm_out_spec(o.sharding, o.ndim)}")
        lines.append("values " + fmt_values(o, dt))
    return lines


def main():
    for g in (gen_binary, gen_broadcast, gen_scalar, gen_unary, gen_where, gen_reduce, gen_softmax,
              gen_matmul, gen_layout, gen_slice, gen_concat, gen_pad, gen_constraint, gen_seed):
        g()
    records = []
    dropped = []
    fam, per_mesh, per_dt = Counter(), Counter(), Counter()
    for cid in sorted(CASES):
        op, params, mesh_key, inputs = CASES[cid]
        try:
            body = run_case(op, params, mesh_key, inputs)
        except Exception as e:  # noqa: BLE001  invalid combination: drop it
            dropped.append((cid, type(e).__name__, str(e).splitlines()[0][:120] if str(e) else ""))
            continue
        sizes, names = mesh_key
        lines = [f"case {cid}", f"mesh {','.join(map(str, sizes))} {','.join(names)}",
                 "op " + " ".join([op] + [f"{k}={enc_param(v)}" for k, v in params])]
        for dt, shape, spec, flag in inputs:
            lines.append(f"in {dt} {enc_shape(shape)} {enc_spec(spec)}" + (f" {flag}" if flag else ""))
        lines += body
        records.append("\n".join(lines))
        fam[family(op)] += 1
        per_mesh["x".join(map(str, sizes))] += 1
        per_dt["/".join(sorted({i[0] for i in inputs}))] += 1
    header = [
        "# global_view_expected.txt -- generated by tests/data/gen_global_view.py; do not edit.",
        f"# jax {jax.__version__} / jaxlib {jaxlib.__version__}, CPU, "
        "--xla_force_host_platform_device_count=8, jax_enable_x64=True, Auto mesh axes.",
        "# One op under jax.jit on inputs committed with device_put(NamedSharding(mesh, spec)).",
        "# See the script's docstring for the format and the input-value formula.",
        f"# {len(records)} cases",
    ]
    with open(OUT_PATH, "w") as fh:
        fh.write("\n".join(header) + "\n\n" + "\n\n".join(records) + "\n")
    print(f"wrote {OUT_PATH}: {len(records)} cases, {os.path.getsize(OUT_PATH)} bytes")
    print(f"dropped {len(dropped)} cases (JAX raised):")
    for cid, et, msg in dropped:
        print(f"  {cid}: {et}: {msg}")
    print("per op family:", dict(sorted(fam.items())))
    print("per mesh:", dict(sorted(per_mesh.items())))
    print("per dtype:", dict(sorted(per_dt.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
