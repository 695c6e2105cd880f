#!/usr/bin/env python3
"""Where a program's GPU time goes, from Nsight Compute's per-kernel durations: reads the CSV of

    ncu --csv --print-units base --metrics gpu__time_duration.sum PROGRAM ... > run.csv

and prints a markdown table, one row per kernel (by function name, template arguments dropped),
sorted by total GPU time: launches, total, median and share of all kernels' time. Lines that are
not ncu's CSV (the program's own output, ==PROF== notes) are skipped. The GPU bundle's
run-gpu.sh runs it for `--benches ncu`.

    python3 bench/ncu_summary.py run.csv [--top 25]
"""
import argparse
import csv
import statistics
import sys

SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
         "second": 1e6, "s": 1e6}


def short(name):
    """The kernel's function name: template arguments, parameters and return type dropped."""
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip()
    s = s.split(" ")[-1] if " " in s else s  # "void foo" -> "foo"
    s = s.replace("::::", "::")  # "(anonymous namespace)" dropped
    return s[:80] or name[:80]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv_file")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    lines = [l for l in open(args.csv_file, errors="replace") if l.startswith('"')]
    if not lines:
        print("ncu_summary: no ncu CSV rows in %s (ncu failed? see its stderr)" % args.csv_file)
        return 1
    rows = list(csv.DictReader(lines))
    times = {}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond").strip()
        try:
            us = float(r["Metric Value"].replace(",", "")) * SCALE.get(unit, 1e-3)
        except (KeyError, ValueError):
            continue
        times.setdefault(short(r.get("Kernel Name", "?")), []).append(us)
    if not times:
        print("ncu_summary: no gpu__time_duration.sum rows in %s" % args.csv_file)
        return 1
    total = sum(sum(v) for v in times.values())
    launches = sum(len(v) for v in times.values())
    print("%d kernel launches, %.1f us of GPU time in all" % (launches, total))
    print()
    print("| kernel | launches | total (us) | median (us) | share |")
    print("| --- | --- | --- | --- | --- |")
    ranked = sorted(times.items(), key=lambda kv: -sum(kv[1]))
    for name, v in ranked[: args.top]:
        print("| %s | %d | %.1f | %.2f | %.1f%% |" % (name, len(v), sum(v), statistics.median(v),
                                                     100.0 * sum(v) / total))
    rest = ranked[args.top:]
    if rest:
        t = sum(sum(v) for _, v in rest)
        print("| (%d other kernels) | %d | %.1f | | %.1f%% |" % (len(rest), sum(len(v) for _, v in rest),
                                                              t, 100.0 * t / total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
