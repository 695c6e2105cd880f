#!/usr/bin/env python3
"""Python's side of meshrt's checkpoint format (train/checkpoint.h), with the `zarr` package (3.x).

Write mode (default) regenerates tests/data/zarr_ckpt/: step 7 of a checkpoint written by
zarr-python in exactly the layout meshrt reads, which tests/test_checkpoint.cpp restores in CI
(no Python at test time):

    python3 -m venv /tmp/zarrenv && /tmp/zarrenv/bin/pip install 'zarr>=3,<4'
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
    args = ap.parse_args()
    if args.read:
        sys.exit(read(args.read))
    write(args.out)


if __name__ == "__main__":
    main()
