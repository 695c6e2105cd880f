#!/usr/bin/env python3
"""Generates tests/data/visualize_expected.txt from JAX itself.

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install jax rich
    /tmp/jaxenv/bin/python tests/data/gen_visualize.py > tests/data/visualize_expected.txt

Each case is a header line
    === mesh=<sizes> names=<names> shape=<dims> spec=<entries>
(entries separated by '|', several axes of one entry joined by '+', '-' for None, '' for P()),
then ' jax_drops_labels' when JAX's table is wider than its 80-column console and rich squeezes
the cell text away (meshrt keeps the labels there instead), followed by exactly what
jax.debug.visualize_sharding prints without colour.
"""
import contextlib
import io
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
from jax._src.debugging import visualize_sharding  # noqa: E402

MESHES = [((8,), ("x",)), ((4, 2), ("x", "y")), ((2, 4), ("x", "y")), ((2, 2, 2), ("x", "y", "z"))]
SHAPES = [(8,), (16,), (8, 4), (8, 8), (4, 8), (16, 2), (2, 16), (8, 1), (1, 8), (32, 64)]


def specs(names):
    out = [(), (None,), ]
    for a in names:
        out += [(a,), (None, a), (a, None)]
    for a in names:
        for b in names:
            if a != b:
                out += [(a, b), ((a, b),), ((a, b), None), (None, (a, b))]
    if len(names) == 3:
        out += [(("x", "y", "z"),), (("z", "x"), "y"), ("y", ("z", "x"))]
    return out


def enc(spec):
    return "|".join("-" if e is None else ("+".join(e) if isinstance(e, tuple) else e) for e in spec)


def main():
    for sizes, names in MESHES:
        mesh = jax.make_mesh(sizes, names, axis_types=(jax.sharding.AxisType.Auto,) * len(sizes))
        for shape in SHAPES:
            for spec in specs(names):
                if len(spec) > len(shape):
                    continue
                sharding = NamedSharding(mesh, P(*spec))
                try:
                    sharding.shard_shape(shape)
                except Exception:
                    continue
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    visualize_sharding(shape, sharding, use_color=False)
                labels = {}
                for dev, idx in sharding.devices_indices_map(shape).items():
                    labels.setdefault(tuple((sl.start, sl.stop) for sl in idx), []).append(dev.id)
                dropped = any("CPU " + ",".join(map(str, sorted(ids))) not in buf.getvalue()
                              for ids in labels.values())
                print(f"=== mesh={','.join(map(str, sizes))} names={','.join(names)} "
                      f"shape={','.join(map(str, shape))} spec={enc(spec)}"
                      + (" jax_drops_labels" if dropped else ""))
                print(buf.getvalue(), end="")


if __name__ == "__main__":
    main()
