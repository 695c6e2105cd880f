#!/usr/bin/env python3
"""Python's side of meshrt's checkpoint format (train/checkpoint.h), with the `zarr` package (3.x).

Write mode (default) regenerates tests/data/zarr_ckpt/: step 7 of a checkpoint written by
zarr-python in exactly the layout meshrt reads, which tests/test_checkpoint.cpp restores in CI
(no Python at test time); and tests/data/zarr_ckpt_lowp/: step 3 with float16 (zarr-python) and
bfloat16 (tensorstore: zarr-python 3.1 has no bfloat16) leaves and a float32 leaf whose casts
(tensorstore's, as orbax restores onto another dtype) are in the metadata:

    python3 -m venv /tmp/zarrenv && /tmp/zarrenv/bin/pip install 'zarr>=3,<4' tensorstore ml_dtypes
    /tmp/zarrenv/bin/python tests/data/gen_checkpoint.py

Read mode opens a checkpoint written by meshrt with zarr.open_group and checks every leaf against
the values `checkpoint_report --interop DIR` writes (the same formulas as below):

    ./build/bench/checkpoint_report --interop /tmp/ck && python gen_checkpoint.py --read /tmp/ck

Layout (one group per step; attributes["meshrt"] holds the format version, the step, the leaves'
Zarr paths and meshrt tree paths, user metadata; one array per leaf at its tree path; codecs bytes
little-endian + crc32c; default chunk keys "c/i/j").
"""
import argparse
import os
import shutil
import sys

import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec

HERE = os.path.dirname(os.path.abspath(__file__))
STEP = 7


def f32_values(n):  # exact in binary: (i mod 17) / 4 - 2
    return ((np.arange(n) % 17) * 0.25 - 2.0).astype(np.float32)


def f64_values(n):
    return (np.arange(n) * 0.5 - 1.25).astype(np.float64)


def int_values(n, dtype):
    return (np.arange(n) * 3 - 7).astype(dtype)


def bool_values(n):
    return np.arange(n) % 3 == 0


# The C++ tree test_checkpoint.cpp restores this onto:
#   struct PyTree { std::map<std::string, Array> params; std::vector<Array> layers;
#                   Array step_count, mask; };
# key, tree path, dtype, shape, chunks, values.
def python_leaves():
    ids = int_values(8, np.int64)
    ids[4:6] = 0  # one whole chunk equal to the fill value: zarr-python does not write it
    return [
        ("params/W", "tree.params['W']", "float32", (4, 6), (2, 3), f32_values(24).reshape(4, 6)),
        ("params/b", "tree.params['b']", "float64", (6,), (4,), f64_values(6)),  # edge chunk
        ("layers/0", "tree.layers[0]", "int32", (3, 4), (2, 4), int_values(12, np.int32).reshape(3, 4)),
        ("layers/1", "tree.layers[1]", "int64", (8,), (2,), ids),
        ("step_count", "tree.step_count", "int64", (), (), np.array(STEP, dtype=np.int64)),
        ("mask", "tree.mask", "bool", (5,), (5,), bool_values(5)),
    ]


def write(out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    leaves = python_leaves()
    group = zarr.open_group(os.path.join(out_dir, str(STEP)), mode="w", zarr_format=3)
    group.attrs["meshrt"] = {
        "format_version": 1,
        "step": STEP,
        "leaves": [{"key": key, "path": path} for key, path, *_ in leaves],
        "metadata": {"writer": "zarr-python " + zarr.__version__},
    }
    for key, _, dtype, shape, chunks, values in leaves:
        fill = False if dtype == "bool" else (0.0 if dtype.startswith("float") else 0)
        a = group.create_array(key, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill,
                               serializer=BytesCodec(endian="little"), compressors=[Crc32cCodec()])
        a[...] = values
    print("wrote", out_dir)


# The low-precision checkpoint (tests/data/zarr_ckpt_lowp/3/): float16 is a core Zarr v3 data type
# and zarr-python writes it; zarr-python 3.1 has no bfloat16, so that leaf is written by tensorstore
# (orbax's writer), which names it "bfloat16" as the registered extension data type does
# (zarr-extensions data-types/bfloat16). Bits, as uint16: signed zeros, infinities, NaN, the
# smallest subnormal, 1 and its neighbour, then normal numbers.
LOWP_STEP = 3


def lowp_bits(n, specials, base, stride):
    return np.array(specials + [base + stride * i for i in range(len(specials), n)], dtype=np.uint16)


def bf16_bits():  # (4, 6), chunks (2, 3)
    return lowp_bits(24, [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x3F80, 0x3F81], 0x3C00, 37)


def f16_bits():  # (10,), chunks (4,): an edge chunk
    return lowp_bits(10, [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x7BFF], 0x3C00, 101)


# float32 values whose casts to bfloat16 and float16 round: ties to even, a bfloat16 subnormal,
# float16 overflow to Inf, a float16 tie to zero. meshrt restores them onto bf16 and f16 targets
# (orbax casts a restored array to its target's dtype with tensorstore's cast); the expected bits
# are tensorstore's cast, stored in the group's metadata.
def master_values():  # (8,), chunks (3,)
    return np.array([1.00390625, 1.01171875, 0.1, -3.0e38, 1e-40, 65520.0, 1e5, 2.0**-25],
                    dtype=np.float32)


def write_lowp(out_dir):
    import ml_dtypes
    import tensorstore as ts
    from importlib.metadata import version
    shutil.rmtree(out_dir, ignore_errors=True)
    master = master_values()

    def cast_bits(dtype):
        bits = ts.cast(ts.array(master), dtype).read().result().view(np.uint16)
        return " ".join(f"0x{b:04x}" for b in bits)

    leaves = [("bf16", "tree['bf16']"), ("f16", "tree['f16']"), ("master", "tree['master']")]
    group = zarr.open_group(os.path.join(out_dir, str(LOWP_STEP)), mode="w", zarr_format=3)
    group.attrs["meshrt"] = {
        "format_version": 1,
        "step": LOWP_STEP,
        "leaves": [{"key": key, "path": path} for key, path in leaves],
        "metadata": {"writer": f"zarr-python {zarr.__version__}, tensorstore {version('tensorstore')}",
                     "cast_bf16": cast_bits(ts.bfloat16), "cast_f16": cast_bits(ts.float16)},
    }
    f16 = group.create_array("f16", shape=(10,), chunks=(4,), dtype="float16", fill_value=0.0,
                             serializer=BytesCodec(endian="little"), compressors=[Crc32cCodec()])
    f16[...] = f16_bits().view(np.float16)
    m = group.create_array("master", shape=(8,), chunks=(3,), dtype="float32", fill_value=0.0,
                           serializer=BytesCodec(endian="little"), compressors=[Crc32cCodec()])
    m[...] = master
    bf16 = ts.open({
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": os.path.join(out_dir, str(LOWP_STEP), "bf16")},
        "metadata": {
            "shape": [4, 6], "data_type": "bfloat16", "fill_value": 0.0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        },
        "create": True, "delete_existing": True,
    }).result()
    bf16[...] = bf16_bits().view(ml_dtypes.bfloat16).reshape(4, 6)
    print("wrote", out_dir)


# What `checkpoint_report --interop DIR` saves as step 1: key -> (dtype, shape, values).
def meshrt_expected():
    return {
        "w": ("float32", (16, 8), f32_values(128).reshape(16, 8)),
        "layers/0": ("float64", (8,), f64_values(8)),
        "layers/1": ("int32", (4, 4), int_values(16, np.int32).reshape(4, 4)),
        "count": ("int64", (), np.array(-7, dtype=np.int64)),
        "mask": ("bool", (8,), bool_values(8)),
    }


def read(ckpt_dir):
    steps = sorted(int(s) for s in os.listdir(ckpt_dir) if s.isdigit())
    group = zarr.open_group(os.path.join(ckpt_dir, str(steps[-1])), mode="r")
    meta = group.attrs["meshrt"]
    print("step", meta["step"], "format_version", meta["format_version"], "leaves",
          [leaf["key"] for leaf in meta["leaves"]])
    ok = True
    for key, (dtype, shape, want) in meshrt_expected().items():
        a = group[key]
        got = a[...]
        same = a.dtype == np.dtype(dtype) and a.shape == shape and np.array_equal(got, want)
        ok &= same
        print(f"  {key}: {a.dtype}{a.shape} chunks {a.chunks} -> {'equal' if same else 'DIFFERENT'}")
    print("all leaves equal" if ok else "MISMATCH")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--read", help="a checkpoint folder written by meshrt to check")
    ap.add_argument("--out", default=os.path.join(HERE, "zarr_ckpt"))
    ap.add_argument("--lowp-out", default=os.path.join(HERE, "zarr_ckpt_lowp"))
    args = ap.parse_args()
    if args.read:
        sys.exit(read(args.read))
    write(args.out)
    write_lowp(args.lowp_out)


if __name__ == "__main__":
    main()
