"""Median, over several bench_membound.py runs of the same sweep, of each row's
cuteforge / torch and cuteforge / quack time ratios: host-bound rows (small N, through
autograd) move by tens of percent between runs, so a bar read off one run is noise.

    python benchmarks/median_runs.py --out benchmarks/results/h200-X-median.json RUN1.json RUN2.json ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from cuteforge.bench.report import write_results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rows: dict[tuple, dict] = {}
    head: dict = {}
    for path in a.runs:
        with open(path) as fh:
            run = json.load(fh)
            head = head or {k: run[k] for k in ("gpu", "date", "torch", "cuteforge") if k in run}
            for r in run["membound"]:
                k = (r["op"], r["dtype"], r["M"], r["N"])
                for ratio in ("cuteforge_over_torch", "cuteforge_over_quack"):
                    if r.get(ratio) is not None:
                        rows.setdefault(k, {}).setdefault(ratio, []).append(r[ratio])
    out = {"command": "python " + " ".join(sys.argv), **head, "runs": a.runs, "rows": []}
    for (op, dtype, m, n), ratios in sorted(rows.items()):
        row = {"op": op, "dtype": dtype, "M": m, "N": n}
        for ratio, vals in ratios.items():
            row[ratio] = vals
            row[ratio + "_median"] = round(statistics.median(vals), 3)
        out["rows"].append(row)
    write_results(a.out, out)
    for row in out["rows"]:
        med = row.get("cuteforge_over_torch_median")
        print(f"{row['op']:18s} {row['dtype']:9s} N={row['N']:6d} vs torch {med}")


if __name__ == "__main__":
    main()
