"""Benchmark reports: PNG plots per op family and one self-contained HTML page.

Every results file follows one schema, written by `results_header()` + `write_results()`
(used by the scripts in `benchmarks/`, `cuteforge bench --json` and the examples) and read
by `load_results()` (`cuteforge bench --from`), so a machine with no GPU can report on
recorded runs:

* `gpu` (str) and `command` (str) are required; `date` (the run's UTC date, ISO 8601),
  `torch`, `cuteforge` and `copy_GBps` (measured device copy bandwidth) are set by the header.
* A *family* is any top-level list of rows with `M`, `N`, `dtype` and `<impl>_GBps` columns
  (bandwidth, compared with `copy_GBps`) or `<impl>_TFLOPs` columns (compute, compared with a
  `cublas` implementation); a GEMM row adds `K`; rows that carry an `op` are grouped by it.
* Any other top-level list or dict is a *section* (config sweeps, tuning, host timings...):
  the report names it and shows the ones it knows how to draw.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import io
import json
import re
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Results = dict[str, Any]

_NOT_FAMILIES = {"config_sweep", "tune"}  # lists of rows that are sections of their own
_METRICS = {"_GBps": "GB/s", "_TFLOPs": "TFLOP/s"}


def _metric(row: dict[str, Any]) -> str | None:
    """The metric suffix a row reports ('_GBps' or '_TFLOPs'), or None."""
    return next((s for s in _METRICS if any(k.endswith(s) and len(k) > len(s) for k in row)), None)


def _family_lists(r: Results) -> dict[str, list[dict[str, Any]]]:
    return {key: v for key, v in r.items() if not key.startswith("_") and key not in _NOT_FAMILIES and isinstance(v, list)
            and v and all(isinstance(row, dict) for row in v) and _metric(v[0]) is not None}


def families(r: Results) -> dict[str, list[dict[str, Any]]]:
    """Family name -> rows of one results dict (rows split by their `op` where they have one)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, rows in _family_lists(r).items():
        for row in rows:
            out.setdefault(str(row.get("op", key)), []).append(row)
    return out


def family_names(results: Sequence[Results]) -> list[str]:
    return list(dict.fromkeys(f for r in results for f in families(r)))


def _impls(rows: Sequence[dict[str, Any]], suffix: str) -> list[str]:
    return list(dict.fromkeys(k[: -len(suffix)] for row in rows for k in row if k.endswith(suffix) and len(k) > len(suffix)))


def _validate(p: Path, r: Any) -> None:
    if not isinstance(r, dict):
        raise ValueError(f"{p}: expected a JSON object at the top level, got {type(r).__name__}")
    for key, what in (("gpu", "the GPU name"), ("command", "the command that produced the file")):
        if not isinstance(r.get(key), str):
            raise ValueError(f"{p}: missing key {key!r} ({what} as a string)")
    fams = _family_lists(r)
    for key, rows in fams.items():
        suffix = _metric(rows[0]) or ""
        for i, row in enumerate(rows):
            missing = [k for k in ("M", "N", "dtype") if k not in row]
            if missing or not isinstance(row["N"], int) or not isinstance(row["M"], int):
                raise ValueError(f"{p}: {key}[{i}] lacks {', '.join(map(repr, missing))}" if missing
                                 else f"{p}: {key}[{i}]: 'M' and 'N' must be integers")
            bad = [k for k in row if k.endswith(suffix) and not isinstance(row[k], (int, float))]
            if bad:
                raise ValueError(f"{p}: {key}[{i}]: {bad[0]!r} is not a number")
        if suffix == "_GBps" and not isinstance(r.get("copy_GBps"), (int, float)):
            raise ValueError(f"{p}: missing key 'copy_GBps' (copy bandwidth, needed with the '{key}' rows)")
    if not fams and not sections(r):
        raise ValueError(f"{p}: nothing to report: no rows with *_GBps or *_TFLOPs columns and no other "
                         "non-empty list or dict section")


def sections(r: Results) -> dict[str, int]:
    """Top-level lists and dicts of `r` that are not families: name -> number of entries."""
    fams = _family_lists(r)
    return {k: len(v) for k, v in r.items() if not k.startswith("_") and k not in fams
            and isinstance(v, (list, dict)) and v}


def results_header(command: str | None = None) -> Results:
    """The common head of a results file: command, gpu, date, torch and cuteforge versions."""
    import torch

    from .. import __version__

    return {"command": command or "python " + shlex.join(sys.argv),  # quoted: the command runs as written
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "cuteforge": __version__}


def write_results(path: str | Path, result: Results, check: bool = True) -> Path:
    """Write a results dict as compact JSON, checked against the schema first unless `check`
    is False (a partial file written while a long run is still going)."""
    if check:
        _validate(Path(path), result)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, separators=(",", ":"), default=str) + "\n")
    return Path(path)


def load_results(paths: Iterable[str | Path]) -> list[Results]:
    """Read and check results JSON files (ValueError naming the file and what is wrong); each
    dict gains `_file` (the path) and `_date` (its `date` key: the date of the run)."""
    out = []
    for path in paths:
        p = Path(path)
        try:
            r = json.loads(p.read_text())
        except OSError as e:
            raise ValueError(f"{p}: cannot read: {e.strerror or e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            where = f" (line {e.lineno}: {e.msg})" if isinstance(e, json.JSONDecodeError) else ""
            raise ValueError(f"{p}: not a results JSON file{where}") from None
        _validate(p, r)
        out.append({**r, "_file": str(p), "_date": str(r.get("date") or "date not recorded")})
    if not out:
        raise ValueError("no results files given")
    return out


def table_rows(results: Sequence[Results], family: str) -> list[dict[str, Any]]:
    """One flat dict per measured row of `family`: shape, dtype, correct, per-impl values.

    `values`/`pct` map implementation -> GB/s (or TFLOP/s) and % of copy (or of cuBLAS);
    `best` is the fastest implementation; `ref` says what the % compares against.
    """
    out = []
    for r in results:
        for row in families(r).get(family, []):
            suffix = _metric(row) or "_GBps"
            names = _impls([row], suffix)
            values = {n: float(row[n + suffix]) for n in names}
            cublas = next((n for n in names if n.lower().startswith("cublas")), None)
            ref = r.get("copy_GBps") if suffix == "_GBps" else values[cublas] if cublas else None
            pct = {n: row.get(f"{n}_pct_copy", round(100 * values[n] / ref, 1) if ref else None) for n in names}
            shape = "x".join(str(row[k]) for k in ("M", "N", "K") if k in row)
            out.append({"gpu": r["gpu"], "shape": shape, "M": row["M"], "N": row["N"], "dtype": row["dtype"],
                        "correct": row.get("correct"), "unit": _METRICS[suffix], "ref": "copy" if suffix == "_GBps" else "cuBLAS",
                        "values": values, "pct": pct, "best": max(values, key=values.__getitem__) if values else None})
    return out


def _figure_class() -> Any:
    """matplotlib's Figure (an Agg canvas, no pyplot global state), or a clear error."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("plots and the HTML report need matplotlib: pip install 'cuteforge[plot]'") from None
    return Figure


def _plot_png(results: Sequence[Results], family: str) -> bytes:
    Figure = _figure_class()
    fig = Figure(figsize=(9, 5.2), dpi=100)
    title = _draw_family(fig.add_subplot(), results, family)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(buf := io.BytesIO(), format="png", dpi=100)
    return buf.getvalue()


def plot_grid(results: Sequence[Results], out_png: Path, columns: int = 2) -> Path:
    """Every family of `results` in one PNG, one panel each (what a report page shows)."""
    Figure = _figure_class()
    fams = family_names(results)
    if not fams:
        raise ValueError("no families to plot in the results")
    rows = -(-len(fams) // columns)
    fig = Figure(figsize=(7 * columns, 4.2 * rows), dpi=50)
    for i, fam in enumerate(fams):
        ax = fig.add_subplot(rows, columns, i + 1)
        ax.set_title(_draw_family(ax, results, fam), fontsize=10)
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(out_png), format="png", dpi=50)
    return Path(out_png)


# One colour per implementation in every plot (cuteforge is always red, torch always blue).
IMPL_COLORS = {"cuteforge": "#d62728", "torch": "#1f77b4", "torch_compile": "#2ca02c", "compile": "#2ca02c",
               "quack": "#9467bd", "cublas": "#000000", "triton": "#ff7f0e", "scaled_mm": "#000000"}
_SPARE_COLORS = ("#8c564b", "#17becf", "#e377c2", "#bcbd22", "#7f7f7f", "#ff7f0e", "#aec7e8", "#98df8a")
# Columns that tell rows of one (dtype, N) apart as separate series, not as repeats.
_VARIANT_KEYS = ("epilogue", "scaling", "set", "phase", "mode", "variant")


def impl_color(name: str) -> str:
    """The colour of an implementation: fixed for the known ones, else stable per name."""
    base = name.lower()
    for known, color in IMPL_COLORS.items():
        if base == known or base.startswith(known + "_"):
            return color
    return _SPARE_COLORS[int(hashlib.sha256(base.encode()).hexdigest(), 16) % len(_SPARE_COLORS)]


def _variant(row: dict[str, Any]) -> str:
    return " ".join(str(row[k]) for k in _VARIANT_KEYS if isinstance(row.get(k), str))


def _draw_family(ax: Any, results: Sequence[Results], family: str) -> str:
    """Draw `family` on `ax`; returns its title."""
    per_file = [(r, families(r).get(family, [])) for r in results]
    per_file = [(r, rows) for r, rows in per_file if rows]
    if not per_file:
        raise ValueError(f"no '{family}' rows in the results")
    suffix = _metric(per_file[0][1][0]) or "_GBps"
    unit, several_gpus = _METRICS[suffix], len(per_file) > 1
    styles, markers = ["-", "--", "-.", ":"], "os^Dv"
    impls: list[str] = []
    dtypes: list[str] = []
    dropped = 0
    for fi, (r, rows) in enumerate(per_file):
        # largest-M row (largest M*K for GEMMs) per (dtype and variant, N)
        pick: dict[tuple[str, int], dict[str, Any]] = {}
        for row in rows:
            k = (" ".join(filter(None, (str(row["dtype"]), _variant(row)))), row["N"])
            if k not in pick or row["M"] * row.get("K", 1) > pick[k]["M"] * pick[k].get("K", 1):
                pick[k] = row
        dropped += len(rows) - len(pick)
        for name in _impls(rows, suffix):
            impls += [name] if name not in impls else []
            is_ref = suffix == "_TFLOPs" and name.lower().startswith("cublas")
            for dt in dict.fromkeys(d for d, _ in pick):
                dtypes += [dt] if dt not in dtypes else []
                pts = sorted((n, row[name + suffix]) for (d, n), row in pick.items() if d == dt and name + suffix in row)
                if not pts:
                    continue
                label = f"{name} {dt}" + (f" ({r['gpu']})" if several_gpus else "")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                        color=impl_color(name),
                        linestyle=styles[(dtypes.index(dt) + fi) % len(styles)],
                        marker=markers[dtypes.index(dt) % len(markers)], linewidth=2.2 if is_ref else 1.6, markersize=5)
        if suffix == "_GBps":
            copy = float(r["copy_GBps"])
            ax.axhline(copy, color="0.35", linestyle=(0, (1, 2)), linewidth=1.4,
                       label=f"copy {copy:.0f} GB/s" + (f" ({r['gpu']})" if several_gpus else ""))
            ax.annotate(f"device copy {copy:.0f} GB/s", xy=(0.01, copy), xycoords=("axes fraction", "data"),
                        xytext=(0, 4), textcoords="offset points", fontsize=8, color="0.3")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (row length, log2 scale)" if suffix == "_GBps" else "N (log2 scale)")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)
    ax.grid(True, which="major", alpha=0.3)
    gpus = ", ".join(dict.fromkeys(str(r["gpu"]) for r, _ in per_file))
    note = (f"largest M per N; {dropped} row{'s' * (dropped != 1)} with a smaller M at the same N not plotted, "
            "all in the table" if dropped else "one M per N")
    ax.legend(fontsize=8, loc="lower right", ncol=2 if len(ax.get_lines()) > 6 else 1, framealpha=0.9)
    return f"{family}: {unit} vs N on {gpus} ({note})"


def plot_family(results: Sequence[Results], family: str, out_png: Path) -> Path:
    """One PNG for `family`: each implementation and dtype vs N, with the copy (or cuBLAS) line."""
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    Path(out_png).write_bytes(_plot_png(results, family))
    return Path(out_png)


def plot_results(results: Sequence[Results], out_dir: Path) -> list[Path]:
    """`<out_dir>/<family>.png` for every family in `results`."""
    safe = {f: re.sub(r"[^A-Za-z0-9_.-]+", "_", f).strip("._") or "family" for f in family_names(results)}
    return [plot_family(results, f, Path(out_dir) / f"{name}.png") for f, name in safe.items()]


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}h1{font-size:24px;margin:0 0 4px}
h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}h3{font-size:15px;margin:16px 0 6px}.sub{color:#555;margin:0 0 12px}
table{border-collapse:collapse;margin:6px 0 14px;font-size:13px}th,td{border:1px solid #d5d5d5;padding:3px 8px;text-align:right}th{background:#f2f4f7;text-align:center}td.l{text-align:left}
td.code{text-align:left;font:12px ui-monospace,monospace;overflow-wrap:anywhere}td.best{background:#d9f2dc;font-weight:600}td.bad{background:#f8d7da;color:#8a1c24;font-weight:600}
img{max-width:100%;border:1px solid #e3e3e3}.note{color:#666;font-size:12px}
"""


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _cfg(v: Any) -> str:
    """'RowReduceConfig(threads=512, unroll=4)' -> 'threads=512, unroll=4'."""
    m = re.fullmatch(r"\w+\((.*)\)", str(v), re.S)
    return m.group(1) if m else str(v)


def _num(v: Any, nd: int = 1) -> str:
    return f"{v:,.{nd}f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else ("—" if v is None else str(v))


def _table(head: Sequence[str], rows: Iterable[Sequence[tuple[str, str]]]) -> str:
    """rows: cells as (text, css class); every text is escaped here."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td class="{c}">{_e(t)}</td>' if c else f"<td>{_e(t)}</td>" for t, c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _family_section(results: Sequence[Results], family: str) -> str:
    rows = table_rows(results, family)
    impls = list(dict.fromkeys(n for row in rows for n in row["values"]))
    unit, ref = rows[0]["unit"], rows[0]["ref"]
    several = len({row["gpu"] for row in rows}) > 1
    head = (["GPU"] if several else []) + ["shape (MxN)", "dtype", "correct"]
    head += [h for n in impls for h in (f"{n} {unit}", f"{n} % {ref}")]
    cells = []
    for row in rows:
        c: list[tuple[str, str]] = [(row["gpu"], "l")] if several else []
        ok = row["correct"]
        c += [(row["shape"], "l"), (row["dtype"], "l"), ("—" if ok is None else "yes" if ok else "NO", "bad" if ok is False else "")]
        for n in impls:
            cls = "best" if n == row["best"] else ""
            c += [(_num(row["values"].get(n)), cls), (_num(row["pct"].get(n)), cls)]
        cells.append(c)
    png = base64.b64encode(_plot_png(results, family)).decode()
    return (f"<h2>{_e(family)}</h2>"
            f'<img alt="{_e(family)}: {_e(unit)} vs N" src="data:image/png;base64,{png}">'
            f"{_table(head, cells)}<p class=note>Fastest implementation per row highlighted; % of {_e(ref)} "
            f"{'is the measured device-to-device copy bandwidth of the same run' if ref == 'copy' else 'is cuBLAS on the same shape'}.</p>")


def _host_section(results: Sequence[Results]) -> str:
    parts = []
    for r in results:
        items = [(k.removesuffix("_us").replace("_", " "), v) for k, v in (r.get("host_overhead") or {}).items()]
        items += list((r.get("host_us") or {}).items())
        if items:
            parts.append(f"<h3>{_e(r['gpu'])} · {_e(Path(r['_file']).name)}</h3>"
                         + _table(["call", "host µs per call"], [[(k, "l"), (_num(v, 2), "")] for k, v in items]))
    return "<h2>Host overhead</h2>" + "".join(parts) if parts else ""


def _cache_section(results: Sequence[Results]) -> str:
    parts = []
    for r in results:
        cc = r.get("compile_cache")
        if not isinstance(cc, dict):
            continue
        cold, warm = cc.get("cold", {}), cc.get("warm", {})
        rows = [("kernels", _num(cc.get("kernels"), 0)),
                ("first call, cold cache (compile), median ms", _num(cc.get("cold_first_call_ms_median"), 2)),
                ("first call, warm cache (disk load), median ms", _num(cc.get("warm_first_call_ms_median"), 2)),
                ("cold: compiles / total compile ms", f"{_num(cold.get('compiles'), 0)} / {_num(cold.get('compile_ms'), 0)}"),
                ("warm: cache loads / total load ms", f"{_num(warm.get('l2_loads'), 0)} / {_num(warm.get('load_ms'), 0)}")]
        parts.append(f"<h3>{_e(r['gpu'])} · {_e(Path(r['_file']).name)}</h3>"
                     + _table(["measure", "value"], [[(k, "l"), (v, "")] for k, v in rows]))
    return "<h2>Compile cache</h2>" + "".join(parts) if parts else ""


def _autotune_section(results: Sequence[Results]) -> str:
    parts = []
    for r in results:
        comp, tune = r.get("compile"), r.get("tune")
        if isinstance(comp, dict):
            parts.append(f"<h3>Parallel compile ({_e(comp.get('jobs', '?'))} kernels for {_e(comp.get('arch', '?'))}, "
                         f"serial {_e(_num(comp.get('serial_s'), 2))} s, {_e(comp.get('cpu_count', '?'))} CPUs)</h3>")
            parts.append(_table(["workers", "startup s", "warm s", "warm speed-up", "cold s", "cold speed-up"],
                                [[(_num(p.get(k), 0 if k == "workers" else 2), "") for k in
                                  ("workers", "startup_s", "warm_s", "warm_speedup", "cold_s", "cold_speedup")]
                                 for p in comp.get("pool", [])]))
        if isinstance(tune, list) and tune:
            parts.append("<h3>Tuned shapes</h3>")
            parts.append(_table(["shape", "dtype", "candidates", "best config", "default config", "tuned GB/s", "speed-up vs default", "second lookup"],
                                [[(t.get("shape", "?"), "l"), (t.get("dtype", "?"), "l"), (_num(t.get("candidates"), 0), ""),
                                  (_cfg(t.get("best", "—")), "code"), (_cfg(t.get("default", "—")), "code"), (_num(t.get("tuned_GBps")), ""),
                                  (_num(t.get("speedup_vs_default"), 3), ""),
                                  (f"{t.get('second_source', '?')}, {_num(t.get('second_s'), 4)} s", "l")] for t in tune]))
    return "<h2>Autotuning</h2>" + "".join(parts) if parts else ""


_DRAWN = {"host_overhead", "host_us", "compile_cache", "compile", "tune"}


def _other_sections(results: Sequence[Results]) -> str:
    """Name every section the report does not draw, so nothing is dropped silently."""
    rows = [[(Path(r["_file"]).name, "l"), (name, "l"), (_num(n, 0), "")]
            for r in results for name, n in sections(r).items() if name not in _DRAWN]
    if not rows:
        return ""
    return ("<h2>Other sections (not drawn)</h2><p class=note>Recorded in the results files but not drawn "
            "by this report; read them in the JSON.</p>" + _table(["file", "section", "entries"], rows))


def html_report(results: Sequence[Results], out_html: Path) -> Path:
    """Write one self-contained HTML page (plots embedded as data URIs, no JS, no external assets)."""
    gpus = ", ".join(dict.fromkeys(str(r["gpu"]) for r in results))
    src_rows = [[(Path(r.get("_file", "?")).name, "l"), (r["gpu"], "l"), (r.get("_date", "—"), "l"),
                 (r.get("command", "—"), "code"),
                 (", ".join(f"{k} {r[k]}" for k in ("cuteforge", "torch") if k in r) or "—", "l")] for r in results]
    body = [f"<h1>cuteforge benchmark report</h1><p class=sub>GPU: <b>{_e(gpus)}</b></p>",
            "<h2>Results files</h2>", _table(["file", "GPU", "date", "command", "versions"], src_rows)]
    body += [_family_section(results, f) for f in family_names(results)]
    body += [_host_section(results), _cache_section(results), _autotune_section(results), _other_sections(results)]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body.append(f"<p class=note>Generated by cuteforge on {_e(stamp)}.</p>")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>cuteforge report: {_e(gpus)}</title>'
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")
    Path(out_html).parent.mkdir(parents=True, exist_ok=True)
    Path(out_html).write_text(page, encoding="utf-8")
    return Path(out_html)


def run_bench(ops: Sequence[str] = ("sum",), shapes: str | None = None, dtypes: str = "float32,bfloat16",
              quick: bool = False, compiled: bool = True, progress: bool = True) -> Results:
    """Measure `ops` on this GPU in the recorded-results format (one family per op).

    Raises RuntimeError when there is no GPU to run on (the CLI turns it into exit 2).
    torch.compile specializes per shape (dynamic=False), so dynamo is reset between shapes.
    """
    from .. import arch
    from .library import (
        QUICK_SHAPES,
        REDUCTION_SHAPES,
        WITH_BACKWARD,
        check_op,
        measure_shapes,
    )

    for op in ops:
        check_op(op)

    if arch.compile_only():
        raise RuntimeError("bench needs a CUDA GPU of the target arch (none here); "
                           "use --from RESULTS.json to report on recorded results")
    import torch

    from ..autotune.problems import parse_shapes
    from ..timing import events as timing

    shape_list = [tuple(s) for s in parse_shapes(shapes)] if shapes else (QUICK_SHAPES if quick else REDUCTION_SHAPES)
    if any(len(s) != 2 for s in shape_list):
        raise ValueError("row ops take shapes MxN, e.g. --shapes 32768x4096")
    dts = [getattr(torch, d.strip(), None) for d in dtypes.split(",") if d.strip()]
    if not dts or not all(isinstance(dt, torch.dtype) and dt.is_floating_point for dt in dts):
        raise ValueError(f"bad --dtype {dtypes!r}: expected e.g. float32,bfloat16,float16")
    copy_bps = timing.copy_bandwidth()
    result: Results = {**results_header("cuteforge " + " ".join(sys.argv[1:])), "copy_GBps": round(copy_bps / 1e9, 1)}
    from ..cli import Progress

    jobs = [(op, dt, shape) for op in ops for dt in dts for shape in shape_list]
    with Progress("benchmarking", len(jobs), enabled=progress) as bar:
        for op, dt, shape in jobs:
            for backward in (False, True) if op in WITH_BACKWARD else (False,):
                rows = measure_shapes(op, [shape], dt, copy_bps, compiled=compiled and not quick, backward=backward)
                result.setdefault(rows[0]["op"], []).extend(rows)
            bar.advance(f"{op} {str(dt)[6:]} {shape[0]}x{shape[1]}")
    return result


def bench_main(ops: Sequence[str], shapes: str | None, dtypes: str, from_paths: Sequence[str] | None,
               json_out: str | None, plot_dir: str | None, report_html: str | None, quick: bool = False) -> list[Results]:
    """`cuteforge bench`: measure (or load with `from_paths`), then write JSON, plots, report."""
    if from_paths and (ops or shapes or json_out):
        raise ValueError("OPS, --shapes and --json measure on a GPU; --from reports recorded results as they are")
    results = load_results(from_paths) if from_paths else [run_bench(ops or ("sum",), shapes, dtypes, quick=quick)]
    if json_out:
        write_results(json_out, results[0])
        results[0] = {**results[0], "_file": json_out, "_date": results[0]["date"]}
    if plot_dir:
        plot_results(results, Path(plot_dir))
    if report_html:
        html_report(results, Path(report_html))
    return results


def print_tables(results: Sequence[Results]) -> None:
    """The family tables on the terminal (rich), best implementation in bold."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for fam in family_names(results):
        rows = table_rows(results, fam)
        impls = list(dict.fromkeys(n for row in rows for n in row["values"]))
        gpus = ", ".join(dict.fromkeys(row["gpu"] for row in rows))
        copies = ", ".join(f"{r['copy_GBps']:.0f}" for r in results if "copy_GBps" in r and fam in families(r))
        t = Table(title=f"{fam} on {gpus}" + (f" (copy {copies} GB/s)" if rows[0]["ref"] == "copy" else ""))
        for col in ["shape", "dtype", "ok"] + [f"{n} {rows[0]['unit']}" for n in impls] + [f"best, % {rows[0]['ref']}"]:
            t.add_column(col, justify="right")
        for row in rows:
            vals = [_num(row["values"].get(n), 0) for n in impls]
            t.add_row(row["shape"], row["dtype"], {True: "yes", False: "[red]NO[/]", None: "—"}[row["correct"]],
                      *[f"[bold green]{v}[/]" if n == row["best"] else v for n, v in zip(impls, vals)],
                      f"{row['best']} {_num(row['pct'].get(row['best']))}")
        console.print(t)
