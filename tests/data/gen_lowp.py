#!/usr/bin/env python3
"""Generates tests/data/lowp_expected.txt: bfloat16 / float16 cases checked against JAX
(conversions and their corner cases, promotion pairs, weak scalars, every Tensor op family,
global-view ops on a sharded mesh, collectives in shard_map, PRNG bits, gradients).
tests/test_lowp.cpp reads it; no Python at test time.

    pip install jax            # CPU jax/jaxlib
    python3 tests/data/gen_lowp.py          # writes tests/data/lowp_expected.txt

The script sets XLA_FLAGS=--xla_force_host_platform_device_count=8, JAX_PLATFORMS=cpu and
jax_enable_x64 itself.  Re-running it with the same JAX version gives the identical file.

File format (one record per case, '#' lines are comments):

    case <id> <op> [key=value ...]
    in <dtype> <comma shape|scalar> <values>        one per array input, in order
    out <dtype> <comma shape|scalar> <tol> <values>

Values are comma-separated; floats are their bits in hex (bf16/f16: 4 digits, f32: 8, f64: 16),
integers decimal, bool 0/1.  tol: how many units in the last place of the output dtype a value
may differ by (0: bit for bit; NaN must meet NaN).  Ops whose result depends on the order of a
float32 accumulation or on XLA's transcendental approximations get tol 1 or 2; conversions,
promotion, + - * /, comparisons, where, max/min, shape ops, PRNG bits and exact sums get 0.
Params: axis=<int|none>, shape=<comma list>, perm=<comma list>, scalar=<python literal>
(weakly typed: '2.5' float, '3' int), dtype=<name>, seed=<int>, lo/hi=<float>, mesh=8,
spec=<spec> ('-' = P(), else entries joined by '|', e.g. 'x|None').
"""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lowp_expected.txt")

DT = {"bf16": jnp.bfloat16, "f16": np.float16, "f32": np.float32, "f64": np.float64,
      "i32": np.int32, "i64": np.int64, "bool": np.bool_}
DT_NAME = {np.dtype(v): k for k, v in DT.items()}
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}

rng = np.random.default_rng(1234)
records = []


def enc(a):
    a = np.asarray(a)
    name = DT_NAME[a.dtype]
    flat = a.reshape(-1)
    if name in ("bf16", "f16", "f32", "f64"):
        w = a.dtype.itemsize * 2
        vals = [format(int(v), "0%dx" % w) for v in flat.view(UINT[a.dtype.itemsize])]
    elif name == "bool":
        vals = ["1" if v else "0" for v in flat]
    else:
        vals = [str(int(v)) for v in flat]
    shape = ",".join(str(d) for d in a.shape) if a.ndim else "scalar"
    return name, shape, ",".join(vals) if vals else "-"


def add(op, ins, out, tol=0, **params):
    cid = len(records)
    ps = " ".join("%s=%s" % (k, v) for k, v in params.items())
    lines = ["case %d %s%s" % (cid, op, (" " + ps) if ps else "")]
    for x in ins:
        n, s, v = enc(x)
        lines.append("in %s %s %s" % (n, s, v))
    outs = out if isinstance(out, (list, tuple)) else [out]
    for o in outs:
        n, s, v = enc(o)
        lines.append("out %s %s %d %s" % (n, s, tol, v))
    records.append("\n".join(lines))


def rand(dt, shape, lo=-4.0, hi=4.0):
    if dt == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dt in ("i32", "i64"):
        return rng.integers(-20, 20, size=shape).astype(DT[dt])
    return rng.uniform(lo, hi, size=shape).astype(np.float32).astype(DT[dt])


def small_ints(dt, shape, lo=-8, hi=8):
    return rng.integers(lo, hi, size=shape).astype(np.float32).astype(DT[dt])


# ---- conversions: every pair of dtypes, plus the corner cases of the 16-bit formats
def bits_f32(*u):
    return np.array(u, dtype=np.uint32).view(np.float32)


corner_f32 = np.concatenate([
    np.array([0.0, -0.0, 1.0, -1.0, 1.00390625, 1.01171875, 1.0029296875, 0.1, 1 / 3, 65504.0,
              65519.0, 65520.0, 65536.0, 70000.0, -65520.0, 3e38, -3.4e38, 1e-8, 6e-8, 3e-8,
              2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -15 + 2.0 ** -25,
              1.17549435e-38, 1e-40, np.inf, -np.inf, 255.5, 256.5, 257.0, 1e6],
             dtype=np.float32),
    bits_f32(0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345, 0xFFA00000, 0x7F810000,
             0x7FFFFFFF, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x00000001,
             0x80000001),
])
corner_f64 = np.array([1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -11 + 2.0 ** -40, 65519.99, 1e300,
                       -1e300, 2.0 ** -25 + 2.0 ** -40, 0.1, np.nan, -np.inf, 1e-320],
                      dtype=np.float64)
corner_i32 = np.array([0, 1, -1, 255, 257, 2049, 65504, 65520, 70000, 2 ** 25 + 2 ** 17 + 1,
                       -(2 ** 31), 2 ** 31 - 1], dtype=np.int32)
corner_i64 = np.array([2 ** 25 + 2 ** 17 + 1, 2 ** 40 + 1, -(2 ** 62), 12345678901], dtype=np.int64)
for to in ("bf16", "f16"):
    for x in (corner_f32, corner_f64, corner_i32, corner_i64,
              np.array([True, False, True], dtype=np.bool_)):
        add("astype", [x], np.asarray(jnp.asarray(x).astype(DT[to])), dtype=to)
half_bits = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0x3C01, 0x7BFF,
                      0x7C00, 0xFC00, 0x7E00, 0x7E01, 0xFE08, 0x7C01, 0x7F80, 0xFF80, 0x7FC1,
                      0x0080, 0x007F, 0x4B00, 0x4F00, 0xCF00, 0x5F00, 0x3555],
                     dtype=np.uint16)
for src in ("bf16", "f16"):
    x = half_bits.view(DT[src])
    for to in DT:
        if to == src:
            continue
        add("astype", [x], np.asarray(jnp.asarray(x).astype(DT[to])), dtype=to)
    for to in ("bf16", "f16", "f32", "i32"):
        r = rand(src, (3, 5), -300, 300)
        add("astype", [r], np.asarray(jnp.asarray(r).astype(DT[to])), dtype=to)
# random f32 / f64 / ints to 16 bits (ties everywhere in the low bits)
for to in ("bf16", "f16"):
    for src in ("f32", "f64"):
        r = rng.uniform(-70000, 70000, size=64).astype(DT[src])
        add("astype", [r], np.asarray(jnp.asarray(r).astype(DT[to])), dtype=to)
        r = (rng.uniform(-1, 1, size=64) * 2.0 ** rng.integers(-30, 20, size=64)).astype(DT[src])
        add("astype", [r], np.asarray(jnp.asarray(r).astype(DT[to])), dtype=to)
    r = rng.integers(-(2 ** 31), 2 ** 31 - 1, size=64).astype(np.int32)
    add("astype", [r], np.asarray(jnp.asarray(r).astype(DT[to])), dtype=to)
# full / arange / zeros in 16 bits (the fill value goes through float, as numpy's)
for dt in ("bf16", "f16"):
    for v in (0.1, 1 / 3, 65520.0, -2.5, 1e-7):
        add("full", [], np.asarray(jnp.full((3,), v, DT[dt])), dtype=dt, value=repr(float(v)))
    for n in (10, 1000):
        add("arange", [], np.asarray(jnp.arange(n, dtype=DT[dt])), dtype=dt, n=n)

# ---- promotion: every pair with a 16-bit side, for add and the other binary ops
BIN = {"add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply,
       "divide": jnp.divide, "maximum": jnp.maximum, "minimum": jnp.minimum,
       "equal": jnp.equal, "not_equal": jnp.not_equal, "less": jnp.less,
       "less_equal": jnp.less_equal, "greater": jnp.greater, "greater_equal": jnp.greater_equal}
for a in DT:
    for b in DT:
        if a not in ("bf16", "f16") and b not in ("bf16", "f16"):
            continue
        for op in ("add", "multiply", "divide", "less"):
            if op == "add" and a == "bool" and b == "bool":
                continue
            x, y = rand(a, (2, 3)), rand(b, (2, 3))
            if op == "divide":
                y = np.where(np.asarray(y, np.float64) == 0, np.ones_like(y), y).astype(y.dtype)
            add(op, [x, y], np.asarray(BIN[op](x, y)))
# every binary op on bf16 / f16, with broadcasting and specials
specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0], dtype=np.float32)
for dt in ("bf16", "f16"):
    for op in BIN:
        x, y = rand(dt, (4, 5)), rand(dt, (5,))
        add(op, [x, y], np.asarray(BIN[op](x, y)))
        s = specials.astype(DT[dt])
        x = np.repeat(s, 6)
        y = np.tile(s, 6)
        add(op, [x, y], np.asarray(BIN[op](x, y)))
# weak scalars: tensor op python scalar keeps the 16-bit dtype
SCAL = {"add": lambda x, s: x + s, "subtract": lambda x, s: x - s,
        "multiply": lambda x, s: x * s, "divide": lambda x, s: x / s,
        "rsubtract": lambda x, s: s - x, "rdivide": lambda x, s: s / x,
        "maximum": lambda x, s: jnp.maximum(x, s), "minimum": lambda x, s: jnp.minimum(x, s),
        "less": lambda x, s: x < s, "equal": lambda x, s: x == s}
for dt in ("bf16", "f16"):
    for op, f in SCAL.items():
        for s in (2.5, 3, 0.1, -7):
            x = rand(dt, (6,))
            if op == "rdivide":
                x = np.where(np.asarray(x, np.float32) == 0, 1, x).astype(x.dtype)
            add(op + "_scalar", [x], np.asarray(f(jnp.asarray(x), s)), scalar=repr(s))
    # f16 overflow through a scalar product
    x = np.array([1000, 30000, -40000, 2], dtype=np.float16) if dt == "f16" else \
        np.array([1e38, 3e38, -2e38, 2], dtype=np.float32).astype(jnp.bfloat16)
    add("multiply_scalar", [x], np.asarray(jnp.asarray(x) * 4), scalar="4")

# ---- unary ops (XLA's float32 approximations, rounded: within 1 ulp)
UN = {"neg": jnp.negative, "exp": jnp.exp, "log": jnp.log, "sin": jnp.sin, "cos": jnp.cos,
      "tanh": jnp.tanh, "sqrt": jnp.sqrt, "relu": jax.nn.relu}
for dt in ("bf16", "f16"):
    for op, f in UN.items():
        lo, hi = (0.01, 8.0) if op in ("log", "sqrt") else (-6.0, 6.0)
        if op == "exp" and dt == "f16":
            hi = 10.0
        x = rand(dt, (3, 7), lo, hi)
        add(op, [x], np.asarray(f(x)), tol=0 if op in ("neg", "relu", "sqrt") else 1)

# ---- where
for dt in ("bf16", "f16"):
    for other in ("bf16", "f32", "i32"):
        c = rand("bool", (3, 4))
        a, b = rand(dt, (3, 4)), rand(other, (4,))
        add("where", [c, a, b], np.asarray(jnp.where(c, a, b)))

# ---- reductions: exact sums (small integers) bit for bit; random ones within 1 ulp
RED = {"sum": jnp.sum, "mean": jnp.mean, "max": jnp.max, "min": jnp.min, "argmax": jnp.argmax}
for dt in ("bf16", "f16"):
    for op, f in RED.items():
        for axis in (None, 0, 1):
            x = small_ints(dt, (6, 40)) if op in ("sum", "mean") else rand(dt, (6, 40))
            add(op, [x], np.asarray(f(x, axis=axis)), axis="none" if axis is None else axis)
            if op in ("sum", "mean"):
                x = rand(dt, (6, 40))
                add(op, [x], np.asarray(f(x, axis=axis)), tol=1,
                    axis="none" if axis is None else axis)
    x = np.arange(1000).astype(np.float32).astype(DT[dt])
    add("sum", [x], np.asarray(jnp.sum(jnp.arange(1000, dtype=DT[dt]))), axis="none")
    add("mean", [x], np.asarray(jnp.mean(jnp.arange(1000, dtype=DT[dt]))), axis="none")
# softmax / log_softmax: several roundings in the input dtype (XLA may keep some in float32)
for dt in ("bf16", "f16"):
    for op, f in (("softmax", jax.nn.softmax), ("log_softmax", jax.nn.log_softmax)):
        for axis in (0, 1):
            x = rand(dt, (4, 6))
            add(op, [x], np.asarray(f(x, axis=axis)), tol=2, axis=axis)

# ---- matmul: exact products of small integers bit for bit; random ones within 1 ulp
for a, b in (("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32"), ("f32", "bf16"), ("bf16", "f16"),
             ("f16", "i32"), ("bf16", "i64")):
    x, y = small_ints(a, (5, 7), -4, 4), small_ints(b, (7, 3), -4, 4)
    add("matmul", [x, y], np.asarray(jnp.matmul(x, y)))
    x, y = rand(a, (4, 16)), rand(b, (16, 6))
    r = np.asarray(jnp.matmul(x, y))
    if r.dtype.itemsize == 2:  # float32 results of random sums differ with the summation order
        add("matmul", [x, y], r, tol=1)
for dt in ("bf16", "f16"):
    x, y = small_ints(dt, (2, 3, 4)), small_ints(dt, (4,))
    add("matmul", [x, y], np.asarray(jnp.matmul(x, y)))
    x, y = small_ints(dt, (2, 3, 4)), small_ints(dt, (2, 4, 5))
    add("matmul", [x, y], np.asarray(jnp.matmul(x, y)))
    x, y = small_ints(dt, (6,)), small_ints(dt, (6,))
    add("dot", [x, y], np.asarray(jnp.dot(x, y)))

# ---- shape ops (bit for bit)
for dt in ("bf16", "f16"):
    x = rand(dt, (4, 6))
    add("reshape", [x], np.asarray(x.reshape(3, 8)), shape="3,8")
    add("transpose", [x], np.asarray(x.T), perm="1,0")
    x3 = rand(dt, (2, 3, 4))
    add("transpose", [x3], np.asarray(jnp.transpose(x3, (2, 0, 1))), perm="2,0,1")
    add("slice", [x], np.asarray(x[1:3]), start=1, size=2, axis=0)
    add("slice", [x], np.asarray(x[:, 2:5]), start=2, size=3, axis=1)
    y = rand(dt, (2, 6))
    add("concatenate", [x, y], np.asarray(jnp.concatenate([x, y], 0)), axis=0)
    z = rand("f32", (4, 2))
    add("concatenate", [x, z], np.asarray(jnp.concatenate([x, z], 1)), axis=1)
    add("pad", [x], np.asarray(jnp.pad(x, ((1, 2), (0, 1)))), widths="1,2,0,1")
    add("stack", [x, x], np.asarray(jnp.stack([x, x], 0)), axis=0)
    add("expand_dims", [x], np.asarray(jnp.expand_dims(x, 1)), axis=1)
    add("squeeze", [x.reshape(4, 1, 6)], np.asarray(x), axis=1)

# ---- global view: ops on Arrays sharded over 8 devices (values and dtype; the spec is checked
# by the test as the sharding of the result's input layout rules, not here)
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))


def put(x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


for dt in ("bf16", "f16"):
    x, y = rand(dt, (16, 4)), rand(dt, (16, 4))
    xs, ys = put(x, P("x")), put(y, P("x"))
    add("g_add", [x, y], np.asarray(jax.jit(jnp.add)(xs, ys)), spec="x")
    add("g_mul_scalar", [x], np.asarray(jax.jit(lambda a: a * 2.5)(xs)), spec="x", scalar="2.5")
    xi = small_ints(dt, (16, 4))
    add("g_sum", [xi], np.asarray(jax.jit(lambda a: jnp.sum(a, 0))(put(xi, P("x")))), spec="x",
        axis=0)
    add("g_sum", [xi], np.asarray(jax.jit(lambda a: jnp.sum(a))(put(xi, P("x")))), spec="x",
        axis="none")
    add("g_mean", [xi], np.asarray(jax.jit(lambda a: jnp.mean(a, 0))(put(xi, P("x")))),
        spec="x", axis=0)
    xr = rand(dt, (16, 4))
    add("g_sum", [xr], np.asarray(jax.jit(lambda a: jnp.sum(a, 0))(put(xr, P("x")))), tol=1,
        spec="x", axis=0)
    add("g_max", [xr], np.asarray(jax.jit(lambda a: jnp.max(a, 0))(put(xr, P("x")))),
        spec="x", axis=0)
    a, b = small_ints(dt, (16, 8), -4, 4), small_ints(dt, (8, 4), -4, 4)
    add("g_matmul", [a, b], np.asarray(jax.jit(jnp.matmul)(put(a, P("x")), put(b, P()))),
        spec="x")
    a, b = small_ints(dt, (4, 16), -4, 4), small_ints(dt, (16, 4), -4, 4)
    add("g_matmul_k", [a, b],
        np.asarray(jax.jit(jnp.matmul)(put(a, P(None, "x")), put(b, P("x")))), spec="x")
    a32 = rand("f32", (16, 4))
    add("g_add", [x, a32], np.asarray(jax.jit(jnp.add)(xs, put(a32, P("x")))), spec="x")
    add("g_astype", [a32], np.asarray(jax.jit(lambda v: v.astype(DT[dt]))(put(a32, P("x")))),
        spec="x", dtype=dt)
    add("g_softmax", [xr], np.asarray(jax.jit(lambda v: jax.nn.softmax(v, 1))(put(xr, P("x")))),
        tol=2, spec="x", axis=1)

# ---- collectives in shard_map over 8 devices: block i is rows [2i, 2i+2) of the input
from jax import shard_map  # noqa: E402

COLL = {"psum": jax.lax.psum, "pmean": jax.lax.pmean, "pmax": jax.lax.pmax, "pmin": jax.lax.pmin}
for dt in ("bf16", "f16"):
    for op, f in COLL.items():
        for kind in ("ints", "halves"):
            x = small_ints(dt, (16, 5), -16, 16)
            if kind == "halves":
                x = (small_ints("f32", (16, 5), -64, 64) / 4).astype(DT[dt])
            g = shard_map(lambda b, f=f: f(b, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P(), check_vma=False)
            add("coll_" + op, [x], np.asarray(jax.jit(g)(put(x, P("x")))), spec="x")
    x = small_ints(dt, (16, 5), -16, 16)
    g = shard_map(lambda b: jax.lax.all_gather(b, "x", tiled=True), mesh=mesh, in_specs=P("x"),
                  out_specs=P(), check_vma=False)
    add("coll_all_gather", [x], np.asarray(jax.jit(g)(put(x, P("x")))), spec="x")
    x = small_ints(dt, (16, 8), -16, 16)
    g = shard_map(lambda b: jax.lax.psum_scatter(b, "x", scatter_dimension=1, tiled=True),
                  mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    add("coll_psum_scatter", [x], np.asarray(jax.jit(g)(put(x, P("x")))), spec="x")

# ---- PRNG: bits of jax.random.uniform / normal in 16 bits (current stream)
for dt in ("bf16", "f16"):
    for seed in (0, 42, 1234):
        k = jax.random.key(seed)
        add("uniform", [], np.asarray(jax.random.uniform(k, (64,), DT[dt])), seed=seed, dtype=dt,
            n=64)
        add("uniform", [], np.asarray(jax.random.uniform(k, (64,), DT[dt], -2.5, 3.7)),
            seed=seed, dtype=dt, n=64, lo=-2.5, hi=3.7)
        add("normal", [], np.asarray(jax.random.normal(k, (256,), DT[dt])), seed=seed, dtype=dt,
            n=256)

# ---- gradients: in the primal's dtype (f32 master weights cast to bf16 get f32 gradients)
for dt in ("bf16", "f16"):
    x = small_ints(dt, (3, 4), -4, 4)
    add("grad_sum_sq", [x], np.asarray(jax.grad(lambda v: jnp.sum(v * v))(x)))
    w = (small_ints("f32", (4, 2), -4, 4) / 2).astype(np.float32)
    xi = small_ints(dt, (3, 4), -4, 4)
    add("grad_cast_matmul", [w, xi],
        np.asarray(jax.grad(lambda w_, x_: jnp.sum(jnp.matmul(x_, w_.astype(DT[dt]))))(w, xi)),
        dtype=dt)
    xm = small_ints(dt, (4, 6), -4, 4)
    add("grad_mean_relu", [xm], np.asarray(jax.grad(lambda v: jnp.mean(jax.nn.relu(v)))(xm)))

with open(OUT_PATH, "w") as fh:
    fh.write("# lowp_expected.txt -- generated by tests/data/gen_lowp.py; do not edit.\n")
    fh.write("# jax %s / jaxlib %s, CPU, --xla_force_host_platform_device_count=8, "
             "jax_enable_x64=True.\n" % (jax.__version__, jaxlib.__version__))
    fh.write("# See the script's docstring for the format.\n")
    fh.write("# %d cases\n" % len(records))
    fh.write("\n".join(records) + "\n")
print("wrote %d cases to %s" % (len(records), OUT_PATH), file=sys.stderr)
