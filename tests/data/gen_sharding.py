#!/usr/bin/env python3
"""Generates tests/data/sharding_expected.txt from JAX's NamedSharding.

    /tmp/jaxenv/bin/python tests/data/gen_sharding.py > tests/data/sharding_expected.txt

One line per case:
    mesh=<sizes> names=<names> shape=<dims> spec=<entries> | <idx D0> ; <idx D1> ; ...
with entries encoded as in gen_visualize.py and each device's index as start:stop per
dimension joined by ',' (devices in mesh.devices.flat order), or
    ... spec=<entries> | error
when JAX rejects the shape (indivisible or spec longer than rank).
"""
import math
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

MESHES = [((8,), ("x",)), ((4, 2), ("x", "y")), ((2, 4), ("x", "y")), ((2, 2, 2), ("x", "y", "z")),
          ((1, 8), ("x", "y")), ((3,), ("x",)), ((2, 3), ("x", "y")), ((1,), ("x",))]
SHAPES = [(), (8,), (12,), (8, 4), (4, 8), (6, 6), (8, 8), (24, 2), (2, 2, 8), (4, 6, 2), (10,)]


def specs(names):
    out = [(), (None,), (None, None)]
    for a in names:
        out += [(a,), (None, a), (a, None), (None, None, a)]
    for a in names:
        for b in names:
            if a != b:
                out += [(a, b), ((a, b),), (None, (a, b)), (b, None, a)]
                for c in names:
                    if c not in (a, b):
                        out += [((a, b, c),), (a, (c, b)), ((c, a), None, b)]
    return out


def enc(spec):
    return "|".join("-" if e is None else ("+".join(e) if isinstance(e, tuple) else e) for e in spec)


def main():
    for sizes, names in MESHES:
        devs = jax.devices()[:math.prod(sizes)]
        mesh = jax.sharding.Mesh(np.array(devs).reshape(sizes), names)
        for shape in SHAPES:
            for spec in specs(names):
                head = (f"mesh={','.join(map(str, sizes))} names={','.join(names)} "
                        f"shape={','.join(map(str, shape))} spec={enc(spec)}")
                s = NamedSharding(mesh, P(*spec))
                try:
                    if len(spec) > len(shape):
                        raise ValueError("rank")
                    m = s.devices_indices_map(shape)
                except ValueError:
                    print(head, "| error")
                    continue
                parts = []
                for d in mesh.devices.flat:
                    idx = m[d]
                    parts.append(",".join(
                        f"{0 if sl.start is None else sl.start}:{n if sl.stop is None else sl.stop}"
                        for sl, n in zip(idx, shape)))
                print(head, "|", " ; ".join(parts))


if __name__ == "__main__":
    main()
