#!/usr/bin/env python3
"""ncu_table.py — sums an ncu --csv log (metric gpu__time_duration.sum) by kernel and grid.

Usage: ncu_table.py LOG.csv [...]. Prints, per log, the kernel count, the sum of kernel
times and the kernels by total time (a decode step's table when the log covers one step)."""
import collections
import csv
import os
import re
import sys


def table(path, top=30):
    rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
    if not rows:
        print(f"== {os.path.basename(path)}: no kernels")
        return
    h = rows[0]
    ki, vi, gi = h.index("Kernel Name"), h.index("Metric Value"), h.index("Grid Size")
    agg = collections.defaultdict(lambda: [0, 0.0])
    total = 0.0
    for r in rows[1:]:
        v = float(r[vi].replace(",", ""))
        name = re.sub(r"\(lm_cu.*", "", r[ki]).replace("<unnamed>::", "").replace("void ", "")
        key = f"{name[:60]} {r[gi]}"
        agg[key][0] += 1
        agg[key][1] += v
        total += v
    print(f"== {os.path.basename(path)}: {len(rows) - 1} kernels, sum of kernel time {total / 1e3:.1f} us")
    for k, (n, v) in sorted(agg.items(), key=lambda x: -x[1][1])[:top]:
        print(f"{v / 1e3:9.1f} us {n:5d} x {v / 1e3 / n:7.2f} us  {k}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        table(p)
