"""Write the README's performance table from the current results files.

    python scripts/perf_table.py            # rewrite the table between the README's markers
    python scripts/perf_table.py --check    # exit 1 if the README's table is not what the files give

The rows: the memory-bound ops (forward and backward, bf16, the widest rows recorded) as
% of the measured device copy bandwidth beside torch eager, and the GEMM bar shapes as
TFLOP/s beside cuBLAS, read from benchmarks/results/ through cuteforge's results loader.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cuteforge.bench import report  # noqa: E402

START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
MEMBOUND = ROOT / "benchmarks/results/h200-membound-bwd.json"
GEMM = ROOT / "benchmarks/results/h200-gemm.json"
OPS = ("softmax", "softmax_bwd", "log_softmax", "rms_norm", "rms_norm_bwd", "layer_norm", "layer_norm_bwd",
       "cross_entropy", "cross_entropy_bwd")
NS = (4096, 262144)


def _pct(row: dict, impl: str) -> str:
    v = row.get(f"{impl}_pct_copy")
    return "—" if v is None else f"{v:.0f} %"


def table() -> str:
    (mem,) = report.load_results([MEMBOUND])
    (gemm,) = report.load_results([GEMM])
    fams = report.families(mem)
    lines = [f"Memory-bound ops, bf16, {mem['gpu']} ({mem['_date']}; copy bandwidth {mem['copy_GBps']:.0f} GB/s = 100 %):",
             "", "| op | M x N | cuteforge | torch eager | speed-up |", "| --- | --- | ---: | ---: | ---: |"]
    for op in OPS:
        for n in NS:
            row = next((r for r in fams.get(op, []) if r["N"] == n and r["dtype"] == "bfloat16"), None)
            if row is None or "cuteforge_us" not in row or "torch_us" not in row:
                continue
            lines.append(f"| {op} | {row['M']} x {n} | {_pct(row, 'cuteforge')} | {_pct(row, 'torch')} | "
                         f"{row['torch_us'] / row['cuteforge_us']:.2f}x |")
    lines += ["", f"GEMM, bf16 in and out, {gemm['gpu']} ({gemm['_date']}), TFLOP/s:", "",
              "| M x N x K | epilogue | cuteforge | cuBLAS | ratio |", "| --- | --- | ---: | ---: | ---: |"]
    gf = report.families(gemm)
    for row in gf.get("plain", []):
        if row.get("set") == "bar" and "cuteforge_TFLOPs" in row:
            lines.append(f"| {row['M']} x {row['N']} x {row['K']} | none | {row['cuteforge_TFLOPs']:.0f} | "
                         f"{row['cublas_TFLOPs']:.0f} | {row['cuteforge_TFLOPs'] / row['cublas_TFLOPs']:.2f} |")
    for row in gf.get("epilogue", []):
        ref = row.get("cublas_eager_TFLOPs")
        if row.get("epilogue") == "bias+gelu" and "cuteforge_TFLOPs" in row and ref:
            lines.append(f"| {row['M']} x {row['N']} x {row['K']} | bias+gelu | {row['cuteforge_TFLOPs']:.0f} | "
                         f"{ref:.0f} (eager epilogue) | {row['cuteforge_TFLOPs'] / ref:.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only; exit 1 when the README is out of date")
    p.add_argument("--readme", default=str(ROOT / "README.md"))
    args = p.parse_args()
    readme = Path(args.readme)
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"{readme}: no {START} ... {END} markers", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table()}\n{END}{tail}"
    if args.check:
        if new != text:
            print(f"{readme}: the performance table is out of date; run python scripts/perf_table.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
