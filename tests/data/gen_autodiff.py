#!/usr/bin/env python3
"""Generates tests/data/autodiff_expected.txt: what `jax.value_and_grad` gives, for
tests/test_autodiff_jax.cpp (meshrt's autodiff against JAX; no JAX at test time).

    pip install jax            # CPU jax/jaxlib
    python3 tests/data/gen_autodiff.py             # writes tests/data/autodiff_expected.txt

The script sets XLA_FLAGS=--xla_force_host_platform_device_count=8, JAX_PLATFORMS=cpu and
jax_enable_x64 itself; meshes have Auto axes.  Inputs come from fixed-seed NumPy generators and
are stored in the file, so re-running it with the same JAX version gives the identical file.

Every case differentiates L = sum_j sum(out_j * W_j) (out_j the program's outputs, W_j stored
random cotangent weights of the same shape and dtype, so every output element matters) with
respect to every float input; for `mlp` records L is the program's scalar output itself.

File format (one record per case, a blank line between records, '#' lines are comments):

    case <id>                               <family>.<name>.<f32|f64>
    op <program> [key=value ...]            (a) device-local program, jnp on one device
    shard_map <body> mesh=<mesh>            (c) jax.grad(shard_map(body)) on the mesh, check_vma on
    mlp <ce|mse>                            (d) the MLPs, inputs x, labels, then the parameters
    in <dtype> <shape> <values...>          one per program input, in order
    in_specs <spec>...                      shard_map only: one per input
    out_specs <spec>                        shard_map only
    w <dtype> <shape> <values...>           one per program output (not for mlp)
    loss <value> <scale>                    L; scale = sum |out * W| (mlp: |L|), the magnitude
                                            L's rounding is relative to
    grad <k> <dtype> <shape> <values...>    dL/d(input k), for every differentiated input k
    array <variant> <mesh> <spec>...        (b, d) the same program on global Arrays: input k
                                            device_put with NamedSharding(mesh, spec k), W
                                            replicated on that mesh (P()); JAX (jit of
                                            value_and_grad on these committed inputs) gives the
                                            same loss and gradients (checked here for f64 op
                                            cases to 1e-12 of the scale, and for the MLPs in both
                                            dtypes; --no-check skips it), so they are not repeated;
                                            the gradient of input k must have input k's sharding
                                            (JAX's Explicit-mode rule and meshrt's contract; Auto
                                            jit may return it replicated, same values)

<shape>: comma list or `scalar`.  <mesh>: `<comma sizes>:<comma axis names>`, devices = the
first prod(sizes) devices, row-major.  <spec>: entries joined by '|', an entry is an axis name,
None or '(a,b)'; '-' = P().  Values: Python repr of the value as a double (f32 values are
exactly representable, so strtod + a cast to float recovers them), row-major; bool inputs 0/1.
Params: ints, `none`, comma lists of ints, floats (with '.', 'e'), dtype names.

Programs (the C++ test mirrors each by name):
  binary add subtract multiply divide maximum minimum (a, b) with NumPy broadcasting;
  scalar_ops: (2.5*x + 1.0) - (0.5 - x)/4.0 + 3.0/(x*x + 1.0);  maximum_scalar / minimum_scalar:
  maximum(x, 0.0) / minimum(x, 0.0);  where_gt: where(c > 0, a, b) (c gets a zero gradient);
  unary neg exp log sin cos tanh sqrt relu;  fanout: x*x + sin(x);  unused: sin(x) (y unused);
  argmax_mul: x * astype(argmax(x, axis=1, keepdims=True), x.dtype);  mixed_add: a + b;
  mixed_mul: a * b;  sum mean max min (axis, keepdims);  softmax log_softmax (axis);  matmul dot;
  transpose (perm or none);  reshape (shape);  slice (start, limit, strides: lax.slice);
  slice_in_dim (start, limit, stride, axis);  dynamic_slice_in_dim (start, size, axis);
  concatenate stack (axis, of all inputs);  split (sections, axis: several outputs);
  squeeze (axes or none);  expand_dims (axis);  pad (widths = before0,after0,before1,...,
  value);  astype (dtype);  row (index: x[index]).
  shard_map bodies: see SM_CASES (psum, pmean, all_gather, psum_scatter, ppermute, all_to_all
  over one or two axes, an unmapped input, invariant values under a mapped out_spec, the DP
  loss pattern).  Untiled all_to_all: JAX 0.10.2 cannot differentiate it ("Expected cotangent
  type float32[8,4,1]{V:x} but got float32[8,1,4]{V:x}"): the expected gradients come from the
  same map written with a tiled all_to_all (forward values checked equal to the untiled one).
  mlp ce: h = relu(x @ w1 + b1); logits = h @ w2 + b2;
          L = -mean(sum(onehot * log_softmax(logits, -1), -1));   inputs x onehot w1 b1 w2 b2
  mlp mse: examples/mlp (the shard_map tutorial's MLP), sizes [16, 32, 32, 8]: relu layers,
          last layer linear, L = mean(sum((pred - y)^2, -1));  inputs x y w0 b0 w1 b1 w2 b2
"""
import math
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autodiff_expected.txt")

DT = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "bool": np.bool_}
DT_NAME = {np.dtype(v): k for k, v in DT.items()}
TOL = {"f32": 1e-5, "f64": 1e-12}
# Also run every Array variant through jax.jit(value_and_grad) on the committed shardings (f64)
# and check it gives the device-local values: --no-check skips that (faster).
CHECK_SHARDED = "--no-check" not in sys.argv

M8 = ((8,), ("x",))
M42 = ((4, 2), ("x", "y"))
M42DM = ((4, 2), ("data", "model"))
_MESHES = {}


def get_mesh(m):
    if m not in _MESHES:
        sizes, names = m
        n = math.prod(sizes)
        mesh = jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(sizes),
                             devices=jax.devices()[:n])
        assert [d.id for d in mesh.devices.flat] == list(range(n))
        _MESHES[m] = mesh
    return _MESHES[m]


# ---------------------------------------------------------------- encoding


def S(*entries):
    return tuple(entries)


def enc_entry(e):
    if e is None:
        return "None"
    if isinstance(e, str):
        return e
    return "(" + ",".join(e) + ")"


def enc_spec(spec):
    return "-" if len(spec) == 0 else "|".join(enc_entry(e) for e in spec)


def enc_mesh(m):
    return ",".join(map(str, m[0])) + ":" + ",".join(m[1])


def enc_shape(shape):
    return "scalar" if len(shape) == 0 else ",".join(map(str, shape))


def fmt_float(v):
    assert math.isfinite(v), v
    r = repr(float(v))
    assert "." in r or "e" in r, r
    return r


def enc_param(v):
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


def dt_name(a):
    return DT_NAME[np.dtype(a.dtype)]


def fmt_array(a):
    a = np.asarray(a)
    dt = dt_name(a)
    flat = a.reshape(-1)
    if dt == "bool":
        vals = " ".join("1" if b else "0" for b in flat)
    else:
        vals = " ".join(fmt_float(float(v)) for v in flat)
    return f"{dt} {enc_shape(a.shape)} {vals}"


# ---------------------------------------------------------------- inputs


def make_value(rng, shape, kind, dtype, prev):
    """kind: n (normal), pos (> 0.5), nz (|v| > 0.5), grid (multiples of 0.5 in [-1, 1]: ties),
    relu0 (normal with exact zeros), tieK (equal to input K at about half the positions)."""
    if kind == "n":
        v = rng.standard_normal(shape)
    elif kind == "pos":
        v = np.abs(rng.standard_normal(shape)) + 0.5
    elif kind == "nz":
        v = rng.standard_normal(shape)
        v = np.sign(v) * (np.abs(v) + 0.5)
    elif kind == "grid":
        v = rng.integers(-2, 3, size=shape) / 2.0
    elif kind == "relu0":
        v = rng.standard_normal(shape)
        v[rng.random(shape) < 0.25] = 0.0
    elif kind.startswith("tie"):
        other = np.asarray(prev[int(kind[3:])], dtype=np.float64)
        v = rng.standard_normal(shape)
        mask = rng.random(shape) < 0.5
        v = np.where(mask, np.broadcast_to(other, shape), v)
    elif kind == "scaled":  # weights: normal / sqrt(fan_in)
        v = rng.standard_normal(shape) / math.sqrt(shape[0])
    elif kind == "small":
        v = 0.1 * rng.standard_normal(shape)
    elif kind.startswith("onehot"):
        labels = rng.integers(0, shape[-1], size=shape[:-1])
        v = np.eye(shape[-1])[labels]
    else:
        raise KeyError(kind)
    return np.asarray(v, dtype=np.float64).astype(DT[dtype]).reshape(shape)


# ---------------------------------------------------------------- programs


def program(name, p):
    binary = {"add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply,
              "divide": jnp.divide, "maximum": jnp.maximum, "minimum": jnp.minimum,
              "mixed_add": jnp.add, "mixed_mul": jnp.multiply}
    if name in binary:
        return binary[name]
    unary = {"neg": jnp.negative, "exp": jnp.exp, "log": jnp.log, "sin": jnp.sin, "cos": jnp.cos,
             "tanh": jnp.tanh, "sqrt": jnp.sqrt, "relu": jax.nn.relu}
    if name in unary:
        return unary[name]
    if name == "scalar_ops":
        return lambda x: (2.5 * x + 1.0) - (0.5 - x) / 4.0 + 3.0 / (x * x + 1.0)
    if name == "maximum_scalar":
        return lambda x: jnp.maximum(x, 0.0)
    if name == "minimum_scalar":
        return lambda x: jnp.minimum(x, 0.0)
    if name == "where_gt":
        return lambda c, a, b: jnp.where(c > 0, a, b)
    if name == "fanout":
        return lambda x: x * x + jnp.sin(x)
    if name == "unused":
        return lambda x, y: jnp.sin(x)
    if name == "argmax_mul":
        return lambda x: x * jnp.argmax(x, axis=1, keepdims=True).astype(x.dtype)
    if name in ("sum", "mean", "max", "min"):
        fn = getattr(jnp, name)
        return lambda x: fn(x, axis=p["axis"], keepdims=bool(p["keepdims"]))
    if name == "softmax":
        return lambda x: jax.nn.softmax(x, axis=p["axis"])
    if name == "log_softmax":
        return lambda x: jax.nn.log_softmax(x, axis=p["axis"])
    if name == "matmul":
        return jnp.matmul
    if name == "dot":
        return jnp.dot
    if name == "transpose":
        return lambda x: jnp.transpose(x, p["perm"])
    if name == "reshape":
        return lambda x: jnp.reshape(x, p["shape"])
    if name == "slice":
        return lambda x: lax.slice(x, p["start"], p["limit"], p["strides"])
    if name == "slice_in_dim":
        return lambda x: lax.slice_in_dim(x, p["start"], p["limit"], p["stride"], p["axis"])
    if name == "dynamic_slice_in_dim":
        return lambda x: lax.dynamic_slice_in_dim(x, p["start"], p["size"], p["axis"])
    if name == "concatenate":
        return lambda *xs: jnp.concatenate(xs, axis=p["axis"])
    if name == "stack":
        return lambda *xs: jnp.stack(xs, axis=p["axis"])
    if name == "split":
        return lambda x: tuple(jnp.split(x, p["sections"], axis=p["axis"]))
    if name == "squeeze":
        return lambda x: jnp.squeeze(x, axis=p["axes"])
    if name == "expand_dims":
        return lambda x: jnp.expand_dims(x, p["axis"])
    if name == "pad":
        w = p["widths"]
        pairs = [(w[2 * d], w[2 * d + 1]) for d in range(len(w) // 2)]
        return lambda x: jnp.pad(x, pairs, constant_values=p["value"])
    if name == "astype":
        return lambda x: x.astype(DT[p["dtype"]])
    if name == "row":
        return lambda x: x[p["index"]]
    raise KeyError(name)


def mlp_ce(x, onehot, w1, b1, w2, b2):
    h = jax.nn.relu(x @ w1 + b1)
    logits = h @ w2 + b2
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits, axis=-1), axis=-1))


def mlp_mse(x, y, *params):
    h = x
    n = len(params) // 2
    for l in range(n):
        z = jnp.dot(h, params[2 * l]) + params[2 * l + 1]
        h = jax.nn.relu(z) if l + 1 < n else z
    d = h - y
    return jnp.mean(jnp.sum(d * d, axis=-1))


# ---------------------------------------------------------------- case list (a, b)

CASES = []  # (name, program, params, [(shape, kind, dtype or None)], diff indices or None)


def case(name, prog, inputs, **params):
    CASES.append((name, prog, params, inputs))


def build_cases():
    sq = (8, 8)
    # binary, with broadcasting and 0-d operands
    case("add", "add", [(sq, "n"), (sq, "n")])
    case("add_bcast_row", "add", [(sq, "n"), ((8,), "n")])
    case("add_bcast_outer", "add", [((8, 1), "n"), ((1, 8), "n")])
    case("add_0d", "add", [(sq, "n"), ((), "n")])
    case("subtract", "subtract", [(sq, "n"), (sq, "n")])
    case("subtract_bcast_col", "subtract", [(sq, "n"), ((8, 1), "n")])
    case("subtract_0d_lhs", "subtract", [((), "n"), (sq, "n")])
    case("multiply", "multiply", [(sq, "n"), (sq, "n")])
    case("multiply_bcast", "multiply", [((8,), "n"), (sq, "n")])
    case("multiply_0d", "multiply", [((), "n"), (sq, "n")])
    case("divide", "divide", [(sq, "n"), (sq, "nz")])
    case("divide_bcast", "divide", [(sq, "n"), ((8,), "nz")])
    case("divide_0d", "divide", [((), "n"), (sq, "nz")])
    case("maximum_ties", "maximum", [(sq, "n"), (sq, "tie0")])
    case("minimum_ties", "minimum", [(sq, "n"), (sq, "tie0")])
    case("maximum_bcast", "maximum", [(sq, "grid"), ((8,), "grid")])
    case("minimum_bcast", "minimum", [((8, 1), "grid"), (sq, "grid")])
    case("maximum_scalar", "maximum_scalar", [(sq, "relu0")])
    case("minimum_scalar", "minimum_scalar", [(sq, "relu0")])
    case("scalar_ops", "scalar_ops", [(sq, "n")])
    case("where_gt", "where_gt", [(sq, "n"), (sq, "n"), (sq, "n")])
    case("where_gt_bcast", "where_gt", [(sq, "n"), ((8,), "n"), ((8, 1), "n")])
    # mixed dtypes: f32 with f64 promotes to f64; the f32 input's gradient is f32
    case("mixed_add", "mixed_add", [(sq, "n", "f32"), (sq, "n", "f64")])
    case("mixed_mul_bcast", "mixed_mul", [((8,), "n", "f64"), (sq, "n", "f32")])
    # unary
    for u in ("neg", "exp", "sin", "cos", "tanh"):
        case(u, u, [(sq, "n")])
    case("log", "log", [(sq, "pos")])
    case("sqrt", "sqrt", [(sq, "pos")])
    case("relu", "relu", [(sq, "relu0")])
    case("fanout", "fanout", [(sq, "n")])
    case("unused", "unused", [(sq, "n"), (sq, "n")])
    case("argmax_mul", "argmax_mul", [(sq, "n")])
    # reductions
    for r in ("sum", "mean", "max", "min"):
        kind = "grid" if r in ("max", "min") else "n"
        for axis in (None, 0, 1):
            for kd in (0, 1):
                case(f"{r}_axis{'none' if axis is None else axis}_kd{kd}", r, [(sq, kind)],
                     axis=axis, keepdims=kd)
    case("sum_3d_axis1", "sum", [((8, 4, 2), "n")], axis=1, keepdims=0)
    case("mean_3d_axisneg1", "mean", [((8, 4, 2), "n")], axis=-1, keepdims=0)
    case("max_3d_axis0_kd1", "max", [((8, 4, 2), "grid")], axis=0, keepdims=1)
    for s in ("softmax", "log_softmax"):
        case(f"{s}_axisneg1", s, [(sq, "n")], axis=-1)
        case(f"{s}_axis0", s, [(sq, "n")], axis=0)
    # matmul / dot
    case("matmul_2d", "matmul", [((8, 4), "n"), ((4, 8), "n")])
    case("matmul_batched_bcast", "matmul", [((2, 8, 4), "n"), ((4, 8), "n")])
    case("matmul_batched", "matmul", [((2, 8, 4), "n"), ((2, 4, 8), "n")])
    case("matmul_batch1_bcast", "matmul", [((1, 8, 4), "n"), ((2, 4, 8), "n")])
    case("matmul_1d_lhs", "matmul", [((4,), "n"), ((4, 8), "n")])
    case("matmul_1d_rhs", "matmul", [((8, 4), "n"), ((4,), "n")])
    case("matmul_1d_1d", "matmul", [((8,), "n"), ((8,), "n")])
    case("dot_2d", "dot", [((8, 4), "n"), ((4, 8), "n")])
    case("dot_2d_1d", "dot", [((8, 4), "n"), ((4,), "n")])
    case("dot_1d_1d", "dot", [((8,), "n"), ((8,), "n")])
    case("dot_3d_1d", "dot", [((8, 2, 4), "n"), ((4,), "n")])
    # shape ops
    case("transpose_2d", "transpose", [((8, 4), "n")], perm=None)
    case("transpose_3d", "transpose", [((4, 8, 2), "n")], perm=(2, 0, 1))
    case("reshape_4x16", "reshape", [(sq, "n")], shape=(4, 16))
    case("reshape_flat", "reshape", [(sq, "n")], shape=(64,))
    case("reshape_infer", "reshape", [(sq, "n")], shape=(-1, 4))
    case("reshape_3d", "reshape", [((8, 4, 2), "n")], shape=(8, 8))
    case("slice", "slice", [(sq, "n")], start=(0, 2), limit=(8, 6), strides=None)
    case("slice_strided", "slice", [(sq, "n")], start=(1, 0), limit=(7, 8), strides=(2, 3))
    case("slice_in_dim_axis0", "slice_in_dim", [(sq, "n")], start=2, limit=8, stride=2, axis=0)
    case("slice_in_dim_axis1", "slice_in_dim", [(sq, "n")], start=1, limit=7, stride=1, axis=1)
    case("dynamic_slice_in_dim_axis0", "dynamic_slice_in_dim", [(sq, "n")], start=3, size=4,
         axis=0)
    case("dynamic_slice_in_dim_clamped", "dynamic_slice_in_dim", [(sq, "n")], start=6, size=4,
         axis=1)
    case("concatenate_axis0", "concatenate", [(sq, "n"), (sq, "n")], axis=0)
    case("concatenate_axis1", "concatenate", [((8, 2), "n"), ((8, 4), "n"), ((8, 2), "n")],
         axis=1)
    case("split_axis0", "split", [((16, 8), "n")], sections=2, axis=0)
    case("split_axis1", "split", [(sq, "n")], sections=4, axis=1)
    case("stack_axis0", "stack", [((8, 4), "n"), ((8, 4), "n"), ((8, 4), "n")], axis=0)
    case("stack_axis2", "stack", [((8, 4), "n"), ((8, 4), "n")], axis=2)
    case("squeeze_all", "squeeze", [((8, 1, 8), "n")], axes=None)
    case("squeeze_axis1", "squeeze", [((8, 1, 8, 1), "n")], axes=(1,))
    case("expand_dims_axis0", "expand_dims", [(sq, "n")], axis=0)
    case("expand_dims_axis2", "expand_dims", [(sq, "n")], axis=2)
    case("pad", "pad", [(sq, "n")], widths=(1, 2, 0, 3), value=0.0)
    case("pad_value", "pad", [((8, 4), "n")], widths=(0, 8, 2, 2), value=1.5)
    case("astype_f32_to_f64", "astype", [(sq, "n", "f32")], dtype="f64")
    case("astype_f64_to_f32", "astype", [(sq, "n", "f64")], dtype="f32")
    case("row", "row", [(sq, "n")], index=3)
    case("row_neg", "row", [((8, 4, 2), "n")], index=-1)


def variants(shapes):
    """A few input shardings per case: (variant name, mesh, [spec per input])."""
    out = []

    def add(name, mesh, specs):
        if all(len(s) == 0 for s in specs) and name != "replicated":
            return
        key = (mesh, tuple(specs))
        if any((m, tuple(s)) == key for _, m, s in out):
            return
        out.append((name, mesh, specs))

    def div(shape, d, n):
        return len(shape) > d and shape[d] % n == 0

    add("x_dim0", M8, [S("x") if div(s, 0, 8) else S() for s in shapes])
    add("x_dim1", M8, [S(None, "x") if div(s, 1, 8) else S() for s in shapes])
    first = [S() for _ in shapes]
    if div(shapes[0], 0, 8):
        first[0] = S("x")
        add("x_first_only", M8, first)

    def xy(s):
        if div(s, 0, 4) and div(s, 1, 2):
            return S("x", "y")
        if len(s) == 1 and div(s, 0, 8):
            return S(("x", "y"))
        if div(s, 0, 4):
            return S("x")
        return S()

    add("xy", M42, [xy(s) for s in shapes])
    add("replicated", M8, [S() for _ in shapes])
    return out


# ---------------------------------------------------------------- evaluation


def close(a, b, dt):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return bool(np.all(np.abs(a - b) <= TOL[dt] * scale))


def loss_and_grads(fn, inputs, ws, diff, at=None):
    """L = sum_j sum(out_j * W_j) and its gradients w.r.t. inputs[diff] (values `at`, default
    inputs[diff])."""

    def L(*d):
        args = list(inputs)
        for k, v in zip(diff, d):
            args[k] = v
        out = fn(*args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if ws is None:
            return outs[0]
        return sum(jnp.sum(o * w) for o, w in zip(outs, ws))

    if at is None:
        at = [inputs[k] for k in diff]
    val, gs = jax.value_and_grad(L, argnums=tuple(range(len(diff))))(*at)
    return val, gs, L


def float_inputs(xs):
    return [k for k, x in enumerate(xs) if dt_name(x) in ("f32", "f64")]


def gen_op_records(warnings):
    records = []
    for ci, (name, prog, params, inputs) in enumerate(CASES):
        fixed_dt = all(len(i) == 3 for i in inputs)
        for dt in (["mixed"] if fixed_dt else ["f32", "f64"]):
            rng = np.random.default_rng(1000 + ci)
            xs = []
            for spec in inputs:
                shape, kind = spec[0], spec[1]
                xs.append(make_value(rng, shape, kind, spec[2] if len(spec) == 3 else dt, xs))
            fn = program(prog, params)
            jx = [jnp.asarray(x) for x in xs]
            out = fn(*jx)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            ws = [jnp.asarray(make_value(rng, o.shape, "n", dt_name(o), None)) for o in outs]
            diff = float_inputs(xs)
            val, gs, L = loss_and_grads(fn, jx, ws, diff)
            scale = float(sum(jnp.sum(jnp.abs(o * w)) for o, w in zip(outs, ws)))
            odt = dt_name(outs[0])
            cid = f"op.{name}.{odt}"
            lines = [f"case {cid}",
                     "op " + " ".join([prog] + [f"{k}={enc_param(v)}" for k, v in params.items()])]
            lines += [f"in {fmt_array(x)}" for x in xs]
            lines += [f"w {fmt_array(w)}" for w in ws]
            lines.append(f"loss {fmt_float(float(val))} {fmt_float(scale)}")
            for k, g in zip(diff, gs):
                assert g.dtype == xs[k].dtype, (cid, k)
                lines.append(f"grad {k} {fmt_array(g)}")
            for vname, mesh_key, specs in variants([x.shape for x in xs]):
                if CHECK_SHARDED and odt == "f64":  # jit on the committed shardings
                    mesh = get_mesh(mesh_key)
                    sx = [jax.device_put(x, NamedSharding(mesh, P(*s))) for x, s in zip(xs, specs)]
                    sw = [jax.device_put(w, NamedSharding(mesh, P())) for w in ws]
                    sval, sgs = jax.jit(lambda d, r: loss_and_grads(
                        fn, [*r], sw, diff, d)[:2])([sx[k] for k in diff], sx)
                    ok = abs(float(sval) - float(val)) <= TOL[odt] * scale
                    for k, g, sg in zip(diff, gs, sgs):
                        ok = ok and close(sg, g, dt_name(xs[k]))
                    if not ok:
                        warnings.append(f"{cid} {vname}: sharded JAX differs from device-local")
                lines.append(f"array {vname} {enc_mesh(mesh_key)} " +
                             " ".join(enc_spec(s) for s in specs))
            records.append("\n".join(lines))
    return records


# ---------------------------------------------------------------- shard_map cases (c)


def ring(n):
    return [(i, (i + 1) % n) for i in range(n)]


PARTIAL_PERM = [(0, 1), (1, 3), (5, 4), (6, 0)]

SM_CASES = [
    # name, mesh, [(shape, kind)], in_specs, out_specs, body
    ("psum", M8, [((16, 4), "n")], [S("x")], S(), lambda x: lax.psum(jnp.sin(x), "x")),
    ("psum_y", M42, [((8, 4), "n")], [S("x", "y")], S("x"), lambda x: lax.psum(x * x, "y")),
    ("psum_xy", M42, [((8, 4), "n")], [S("x", "y")], S(),
     lambda x: lax.psum(jnp.sin(x), ("x", "y"))),
    ("pmean", M8, [((16, 4), "n")], [S("x")], S(), lambda x: lax.pmean(x * x, "x")),
    ("pmean_xy", M42, [((8, 4), "n")], [S("x", "y")], S(),
     lambda x: lax.pmean(jnp.exp(x), ("x", "y"))),
    ("all_gather_tiled0", M8, [((8, 4), "n")], [S("x")], S("x"),
     lambda x: lax.all_gather(jnp.sin(x), "x", axis=0, tiled=True)),
    ("all_gather_untiled0", M8, [((8, 4), "n")], [S("x")], S("x"),
     lambda x: lax.all_gather(x, "x", axis=0, tiled=False)),
    ("all_gather_tiled1", M8, [((4, 8), "n")], [S(None, "x")], S(None, "x"),
     lambda x: lax.all_gather(x, "x", axis=1, tiled=True)),
    ("all_gather_untiled1", M8, [((8, 4), "n")], [S("x")], S("x"),
     lambda x: lax.all_gather(x, "x", axis=1, tiled=False)),
    ("all_gather_y", M42, [((8, 4), "n")], [S("x", "y")], S("x", "y"),
     lambda x: lax.all_gather(x, "y", axis=1, tiled=True)),
    ("all_gather_xy", M42, [((8, 4), "n")], [S("x", "y")], S("x", "y"),
     lambda x: lax.all_gather(jnp.sin(x), ("x", "y"), axis=0, tiled=True)),
    ("all_gather_matmul", M8, [((16, 8), "n"), ((8, 4), "n")], [S("x"), S("x")], S("x"),
     lambda x, w: jnp.matmul(x, lax.all_gather(w, "x", axis=0, tiled=True))),
    ("psum_scatter_tiled0", M8, [((64, 4), "n")], [S("x")], S("x"),
     lambda x: lax.psum_scatter(jnp.sin(x), "x", scatter_dimension=0, tiled=True)),
    ("psum_scatter_untiled0", M8, [((64, 4), "n")], [S("x")], S("x"),
     lambda x: lax.psum_scatter(x, "x", scatter_dimension=0, tiled=False)),
    ("psum_scatter_tiled1", M8, [((4, 64), "n")], [S(None, "x")], S(None, "x"),
     lambda x: lax.psum_scatter(x, "x", scatter_dimension=1, tiled=True)),
    ("psum_scatter_untiled1", M8, [((32, 8), "n")], [S("x")], S("x"),
     lambda x: lax.psum_scatter(x * x, "x", scatter_dimension=1, tiled=False)),
    ("psum_scatter_y", M42, [((8, 16), "n")], [S("x", "y")], S("x", "y"),
     lambda x: lax.psum_scatter(x, "y", scatter_dimension=1, tiled=True)),
    ("ppermute_ring", M8, [((8, 4), "n")], [S("x")], S("x"),
     lambda x: lax.ppermute(jnp.sin(x), "x", ring(8))),
    ("ppermute_partial", M8, [((8, 4), "n")], [S("x")], S("x"),
     lambda x: lax.ppermute(x, "x", PARTIAL_PERM)),
    ("ppermute_y", M42, [((8, 4), "n")], [S("x", "y")], S("x", "y"),
     lambda x: lax.ppermute(x * x, "y", [(0, 1), (1, 0)])),
    ("all_to_all_s0c1", M8, [((64, 4), "n")], [S("x")], S("x"),
     lambda x: lax.all_to_all(x, "x", 0, 1, tiled=True)),
    ("all_to_all_s1c0", M8, [((8, 16), "n")], [S("x")], S("x"),
     lambda x: lax.all_to_all(jnp.sin(x), "x", 1, 0, tiled=True)),
    # Untiled all_to_all: JAX 0.10.2 cannot differentiate it ("Expected cotangent type
    # float32[8,4,1]{V:x} but got float32[8,1,4]{V:x}"), so its gradient is taken through the
    # same map written with a tiled all_to_all (UNTILED_SAME checks the forward values agree).
    ("all_to_all_untiled_s0c1", M8, [((64, 4), "n")], [S("x")], S("x"),
     lambda x: jnp.transpose(jnp.squeeze(lax.all_to_all(x[:, None, :], "x", 0, 1, tiled=True),
                                         0))),
    ("all_to_all_untiled_s1c0", M8, [((16, 8), "n")], [S("x")], S("x"),
     lambda x: jnp.squeeze(lax.all_to_all((x * x)[None], "x", 2, 0, tiled=True), 2)),
    ("unmapped_input", M8, [((8, 4), "n"), ((4,), "n")], [S("x"), S()], S("x"),
     lambda x, w: jnp.sin(x) * w),
    ("invariant_out_mapped", M8, [((8, 4), "n")], [S("x")], S("x"), lambda x: lax.psum(x, "x")),
    ("replicated_out_mapped", M8, [((2, 4), "n")], [S()], S("x"), lambda w: jnp.sin(w)),
    ("dp_loss", M8, [((16, 4), "n"), ((16,), "n"), ((4,), "n")], [S("x"), S("x"), S()], S(),
     lambda x, y, w: lax.pmean(jnp.mean((jnp.matmul(x, w) - y) * (jnp.matmul(x, w) - y)), "x")),
]


# What the untiled cases compute, with JAX's untiled all_to_all (forward only).
UNTILED_SAME = {
    "all_to_all_untiled_s0c1": lambda x: lax.all_to_all(x, "x", 0, 1, tiled=False),
    "all_to_all_untiled_s1c0": lambda x: lax.all_to_all(x * x, "x", 1, 0, tiled=False),
}


def gen_shard_map_records():
    records = []
    for ci, (name, mesh_key, inputs, in_specs, out_spec, body) in enumerate(SM_CASES):
        mesh = get_mesh(mesh_key)
        for dt in ("f32", "f64"):
            rng = np.random.default_rng(5000 + ci)
            xs = [make_value(rng, shape, kind, dt, None) for shape, kind in inputs]
            sx = [jax.device_put(x, NamedSharding(mesh, P(*s))) for x, s in zip(xs, in_specs)]
            f = jax.shard_map(body, mesh=mesh, in_specs=tuple(P(*s) for s in in_specs),
                              out_specs=P(*out_spec))
            out = f(*sx)
            if name in UNTILED_SAME:
                ref = jax.shard_map(UNTILED_SAME[name], mesh=mesh, in_specs=P(*in_specs[0]),
                                    out_specs=P(*out_spec))(*sx)
                assert ref.shape == out.shape and np.array_equal(ref, out), name
            w = make_value(rng, out.shape, "n", dt, None)
            sw = jax.device_put(w, NamedSharding(mesh, P(*out_spec)))
            diff = list(range(len(xs)))
            val, gs, _ = loss_and_grads(f, sx, [sw], diff)
            scale = float(jnp.sum(jnp.abs(out * sw)))
            lines = [f"case sm.{name}.{dt}", f"shard_map {name} mesh={enc_mesh(mesh_key)}"]
            lines += [f"in {fmt_array(x)}" for x in xs]
            lines.append("in_specs " + " ".join(enc_spec(s) for s in in_specs))
            lines.append("out_specs " + enc_spec(out_spec))
            lines.append(f"w {fmt_array(w)}")
            lines.append(f"loss {fmt_float(float(val))} {fmt_float(scale)}")
            for k, g in zip(diff, gs):
                lines.append(f"grad {k} {fmt_array(np.asarray(g))}")
            records.append("\n".join(lines))
    return records


# ---------------------------------------------------------------- MLPs (d)


def gen_mlp_records(warnings):
    records = []
    N = None
    ce_inputs = [((16, 16), "n"), ((16, 8), "onehot"), ((16, 32), "scaled"), ((32,), "small"),
                 ((32, 8), "scaled"), ((8,), "small")]
    ce_variants = [
        ("dp", M8, [S("x"), S("x"), S(), S(), S(), S()]),
        ("fsdp", M8, [S("x"), S("x"), S("x", N), S("x"), S("x", N), S("x")]),
        ("tp", M8, [S(), S(), S(N, "x"), S("x"), S("x", N), S()]),
        ("2d", M42DM, [S("data"), S("data"), S(N, "model"), S("model"), S("model", N), S()]),
    ]
    sizes = [16, 32, 32, 8]
    mse_inputs = [((16, 16), "n"), ((16, 8), "n")]
    for a, b in zip(sizes[:-1], sizes[1:]):
        mse_inputs += [((a, b), "scaled"), ((b,), "n")]
    nparam = 2 * (len(sizes) - 1)
    # examples/mlp/mlp.cpp's shardings: dp x,y batch; fsdp also every W and b on dim 0; tp x,y
    # features and W, b on dim 0; 2-D x,y P(data, model), W, b P(model).
    mse_variants = [
        ("dp", M8, [S("x"), S("x")] + [S()] * nparam),
        ("fsdp", M8, [S("x"), S("x")] + [S("x")] * nparam),
        ("tp", M8, [S(N, "x"), S(N, "x")] + [S("x")] * nparam),
        ("2d", M42DM, [S("data", "model"), S("data", "model")] + [S("model")] * nparam),
    ]
    for mi, (kind, fn, inputs, vars_) in enumerate([("ce", mlp_ce, ce_inputs, ce_variants),
                                                    ("mse", mlp_mse, mse_inputs, mse_variants)]):
        for dt in ("f32", "f64"):
            rng = np.random.default_rng(9000 + mi)
            xs = [make_value(rng, shape, k, dt, None) for shape, k in inputs]
            jx = [jnp.asarray(x) for x in xs]
            diff = list(range(2, len(xs)))
            val, gs, _ = loss_and_grads(fn, jx, None, diff)
            lines = [f"case mlp.{kind}.{dt}", f"mlp {kind}"]
            lines += [f"in {fmt_array(x)}" for x in xs]
            lines.append(f"loss {fmt_float(float(val))} {fmt_float(abs(float(val)))}")
            for k, g in zip(diff, gs):
                lines.append(f"grad {k} {fmt_array(g)}")
            for vname, mesh_key, specs in vars_:
                mesh = get_mesh(mesh_key)
                sx = [jax.device_put(x, NamedSharding(mesh, P(*s))) for x, s in zip(xs, specs)]
                sval, sgs = jax.jit(jax.value_and_grad(
                    lambda p, x, y: fn(x, y, *p)))([sx[k] for k in diff], sx[0], sx[1])
                ok = abs(float(sval) - float(val)) <= TOL[dt] * abs(float(val))
                for g, sg in zip(gs, sgs):
                    ok = ok and close(sg, g, dt)
                if not ok:
                    warnings.append(f"mlp.{kind}.{dt} {vname}: sharded JAX differs")
                lines.append(f"array {vname} {enc_mesh(mesh_key)} " +
                             " ".join(enc_spec(s) for s in specs))
            records.append("\n".join(lines))
    return records


def main():
    build_cases()
    warnings = []
    records = gen_op_records(warnings)
    n_op = len(records)
    records += gen_shard_map_records()
    n_sm = len(records) - n_op
    records += gen_mlp_records(warnings)
    n_mlp = len(records) - n_op - n_sm
    header = [
        "# autodiff_expected.txt -- generated by tests/data/gen_autodiff.py; do not edit.",
        f"# jax {jax.__version__} / jaxlib {jaxlib.__version__}, CPU, "
        "--xla_force_host_platform_device_count=8, jax_enable_x64=True, Auto mesh axes.",
        "# jax.value_and_grad of L = sum(out * W); see the script's docstring for the format.",
        f"# {len(records)} cases: {n_op} op, {n_sm} shard_map, {n_mlp} mlp",
    ]
    with open(OUT_PATH, "w") as fh:
        fh.write("\n".join(header) + "\n\n" + "\n\n".join(records) + "\n")
    print(f"wrote {OUT_PATH}: {len(records)} cases ({n_op} op, {n_sm} shard_map, {n_mlp} mlp), "
          f"{os.path.getsize(OUT_PATH)} bytes")
    for w in warnings:
        print("WARNING:", w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
