"""Tuning a problem set on N GPUs against one GPU: wall time, and whether the winners agree.

The problem set spans the library's tunable kernels (GEMM, reductions, softmax, norms,
cross-entropy). Three contenders tune the whole set, each in its own process tree:

- `one`: one process on GPU 0, `tune_main` kernel after kernel (`cuteforge tune`);
- `distributed`: `torchrun --nproc-per-node N`, every rank calling `distributed.tune` kernel
  after kernel (`cuteforge tune --distributed`): the ranks split each kernel's shapes;
- `gpus`: one process that compiles every candidate, then times the shapes in one process
  per GPU (`cuteforge tune --gpus all`).

Each contender runs twice on its own kernel cache (only the C++ extension is shared): `cold`
compiles every candidate and tunes; `warm` re-tunes (`--force`) with every object compiled,
so it measures the timing and checking alone. Contenders are interleaved within a round. The
wall times are of the whole command (process start-up and launcher included) and of the
tuning inside it.

Agreement: for every shape, the winner a multi-GPU contender chose is looked up in the
one-GPU sweep of the same round (every candidate timed on GPU 0): its time there over the
one-GPU winner's is the `slowdown` (bar: <= 1.02).

    python benchmarks/bench_tune_gpus.py --out benchmarks/results/h200x2-tune-gpus.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# (kernel, shapes, dtype, params): each kernel's shapes are dealt to the GPUs in this order.
PROBLEMS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("gemm_sm90_tn", "8192x8192x4096,4096x14336x4096,4096x4096x4096,2048x2048x2048,"
     "4096x11008x4096,4096x4096x11008,2048x8192x8192,1024x4096x4096", "bfloat16", {}),
    ("row_reduce", "32768x4096,4096x65536,16384x16384,32768x1024", "float32", {}),
    ("softmax_fwd", "16384x8192,8192x50257,4096x32768,32768x2048", "bfloat16", {}),
    ("norm_fwd", "16384x4096,8192x14336,4096x8192,32768x2048", "bfloat16", {}),
    ("cross_entropy_fwd", "8192x32000,4096x128256,8192x50257,4096x151936", "bfloat16", {}),
]
CONTENDERS = ("one", "distributed", "gpus")
RECHECK_ROUNDS = 40  # interleaved rounds of the side-by-side timing of two winners


# --------------------------------------------------------------------------- children


def _child_one(gpus: str | None, force: bool) -> dict[str, Any]:
    from cuteforge.tune_cli import tune_main

    rows, t0 = [], time.perf_counter()
    for kernel, shapes, dtype, params in PROBLEMS:
        r = tune_main(kernel, shapes, dtype, gpus=gpus, params=dict(params), force=force, progress=False, verbose=False)
        assert r is not None
        rows += [{**s, "kernel": kernel} for s in r["shapes"]]
    return {"tune_s": time.perf_counter() - t0, "rows": rows}


def _child_distributed(force: bool) -> dict[str, Any] | None:
    import torch.distributed as dist

    from cuteforge import distributed

    dist.init_process_group(backend="gloo")
    try:
        dist.barrier()
        rows, t0 = [], time.perf_counter()
        for kernel, shapes, dtype, params in PROBLEMS:
            r = distributed.tune(kernel, shapes, dtype, params=dict(params), force=force)
            if r is not None:
                rows += [{**s, "kernel": kernel} for s in r["shapes"]]
        return {"tune_s": time.perf_counter() - t0, "rows": rows, "ranks": dist.get_world_size()} if dist.get_rank() == 0 else None
    finally:
        dist.destroy_process_group()


def _child_recheck(pairs_file: str) -> dict[str, Any]:
    """Each pair of winners timed side by side on this process's GPU, interleaved (one tuner
    sweep of just those configs, many rounds, nothing stored)."""
    from cuteforge.autotune import tune
    from cuteforge.autotune.candidates import candidates, norm_params
    from cuteforge.autotune.measure import measurement
    from cuteforge.autotune.problems import parse_shapes
    from cuteforge.autotune.store import config_repr
    from cuteforge.tune_cli import library_kernel, problem_factory

    out = []
    for item in json.loads(Path(pairs_file).read_text()):
        k = library_kernel(item["kernel"])
        (shape,) = parse_shapes(item["shape"])
        p = problem_factory(k.name)(shape, item["dtype"], dict(item["params"]))
        every = candidates(k, k.spec(p.key, norm_params(p.params), None), p.configs)[0]
        chosen = [c for c in every if config_repr(c) in item["configs"]]
        tensors = measurement().tensors(p.make_tensors)
        res = tune(k, tensors, p.params, configs=chosen, reference=p.reference, workers=0, force=True, key=p.key,
                   dims=p.dims, outputs=p.outputs, store=False, rounds=RECHECK_ROUNDS)
        out.append({**item, "times_ms": {config_repr(c): t for c, t in res.times_ms.items()}})
    return {"tune_s": 0.0, "rows": out}


def child_main(which: str, force: bool, pairs: str | None = None) -> None:
    result = (_child_distributed(force) if which == "distributed" else _child_recheck(pairs) if which == "recheck"
              else _child_one("all" if which == "gpus" else None, force))
    if result is not None:
        print("RESULT " + json.dumps(result, default=str), flush=True)


# --------------------------------------------------------------------------- parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(which: str, n_gpus: int, extra: list[str]) -> list[str]:
    me = [str(Path(__file__).resolve()), "--child", which, *extra]
    if which == "distributed":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n_gpus),
                "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *me]
    return [sys.executable, *me]


def _run(which: str, n_gpus: int, cache: Path, extra: list[str], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "CUTEFORGE_CACHE_DIR": str(cache)}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(n_gpus))) if which in ("distributed", "gpus") else "0"
    t0 = time.perf_counter()
    p = subprocess.run(_command(which, n_gpus, extra), env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        raise RuntimeError(f"{which} failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return {**json.loads(lines[-1][len("RESULT "):]), "wall_s": wall}


def _native_build() -> Path:
    """The C++ extension's build directory in the cache this script runs with (built now if
    it is not), copied into every contender's fresh cache."""
    p = subprocess.run([sys.executable, "-m", "cuteforge", "build-native", "--json"], check=True, capture_output=True,
                       text=True)
    return Path(json.loads(p.stdout[p.stdout.index("{"):])["dir"])


def _problem_of(kernel: str) -> tuple[str, dict[str, Any]]:
    return next((d, p) for k, _, d, p in PROBLEMS if k == kernel)


def _recheck(runs: dict[str, dict[str, Any]], cache: Path, timeout: float) -> dict[tuple[str, str], dict[str, float]]:
    """For every shape whose winner is not the same in every run, all its winners timed side
    by side on GPU 0: (kernel, shape) -> {config: ms}."""
    winners: dict[tuple[str, str], set[str]] = {}
    for run in runs.values():
        for r in run["rows"]:
            winners.setdefault((r["kernel"], r["shape"]), set()).add(r["best"])
    items = [{"kernel": k, "shape": sh, "dtype": _problem_of(k)[0], "params": _problem_of(k)[1], "configs": sorted(cs)}
             for (k, sh), cs in winners.items() if len(cs) > 1]
    if not items:
        return {}
    f = cache / "pairs.json"
    f.write_text(json.dumps(items))
    timed = _run("recheck", 1, cache, ["--pairs", str(f)], timeout)["rows"]
    return {(it["kernel"], it["shape"]): it["times_ms"] for it in timed}


def _agreement(one: list[dict[str, Any]], other: list[dict[str, Any]],
               side_by_side: dict[tuple[str, str], dict[str, float]]) -> list[dict[str, Any]]:
    """Per shape: the same winner as the one-GPU run, else the other winner's time over the
    one-GPU winner's, timed side by side (`_recheck`), and as the one-GPU sweep had it."""
    ref = {(r["kernel"], r["shape"]): r for r in one}
    out = []
    for r in other:
        ident = (r["kernel"], r["shape"])
        base, same = ref[ident], r["best"] == ref[ident]["best"]
        t_best, t_theirs = base["times_ms"].get(base["best"]), base["times_ms"].get(r["best"])
        pair = side_by_side.get(ident, {})
        slowdown = 1.0 if same else (round(pair[r["best"]] / pair[base["best"]], 4)
                                     if pair.get(r["best"]) and pair.get(base["best"]) else None)
        out.append({"kernel": r["kernel"], "shape": r["shape"], "same": same, "by": r.get("rank", r.get("gpu_index")),
                    "slowdown": slowdown, "side_by_side_ms": pair or None,
                    "slowdown_in_sweep": None if not (t_best and t_theirs) else round(t_theirs / t_best, 4)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=(*CONTENDERS, "recheck"), help=argparse.SUPPRESS)
    ap.add_argument("--force", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pairs", help=argparse.SUPPRESS)
    ap.add_argument("--gpus", type=int, help="GPUs for the multi-GPU contenders (default: all)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated, of {', '.join(CONTENDERS)} "
                    "('one' is always run: it is the reference)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900, help="seconds a contender's command may take")
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args()
    if args.child:
        child_main(args.child, args.force, args.pairs)
        return

    import torch

    from cuteforge.bench.report import results_header, write_results

    n = args.gpus or torch.cuda.device_count()
    if n < 2:
        raise SystemExit(f"needs 2 or more GPUs, this machine has {torch.cuda.device_count()}")
    unknown = set(args.contenders.split(",")) - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"--contenders: unknown {sorted(unknown)}")
    contenders = ["one", *[c for c in CONTENDERS[1:] if c in args.contenders.split(",")]]
    # every process of the runs below keeps its bytecode: Python start-up is not what is measured
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "cuteforge-bench-pyc"))
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    result: dict[str, Any] = {**results_header(), "gpus": n, "recheck_rounds": RECHECK_ROUNDS,
                              "problems": [{"kernel": k, "shapes": s, "dtype": d, "params": p} for k, s, d, p in PROBLEMS],
                              "runs": [], "summary": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        native = _native_build()
        for rnd in range(args.rounds):
            order = contenders[rnd % len(contenders):] + contenders[: rnd % len(contenders)]
            runs: dict[str, dict[str, Any]] = {}
            for which in order:
                cache = root / f"{rnd}-{which}"
                shutil.copytree(native, cache / "native" / native.name)
                for phase in ("cold", "warm"):
                    r = _run(which, n, cache, ["--force"] if phase == "warm" else [], args.timeout)
                    runs[f"{which}/{phase}"] = r
                    print(f"round {rnd} {which:12s} {phase}: {r['wall_s']:7.1f} s command, {r['tune_s']:7.1f} s tuning",
                          flush=True)
            side_by_side = _recheck(runs, root / f"{rnd}-one", args.timeout)  # the one-GPU cache has every candidate
            for which in order:
                shutil.rmtree(root / f"{rnd}-{which}")
            for name, r in runs.items():
                which, phase = name.split("/")
                row = {"round": rnd, "contender": which, "phase": phase, "wall_s": round(r["wall_s"], 2),
                       "tune_s": round(r["tune_s"], 2), "shapes": len(r["rows"]),
                       "compiles": sum(s["compiles"] for s in r["rows"])}
                if which != "one":
                    agree = _agreement(runs[f"one/{phase}"]["rows"], r["rows"], side_by_side)
                    row.update(agreement=agree, same_winner=sum(a["same"] for a in agree),
                               worst_slowdown=max((a["slowdown"] or float("inf")) for a in agree))
                else:
                    row["winners"] = [{"kernel": s["kernel"], "shape": s["shape"], "best": s["best"], "best_ms": s["best_ms"]}
                                      for s in r["rows"]]
                result["runs"].append(row)
            if args.out:
                write_results(args.out, result, check=False)
    for which in contenders[1:]:
        for phase in ("cold", "warm"):
            mine = [r for r in result["runs"] if r["contender"] == which and r["phase"] == phase]
            ones = {r["round"]: r for r in result["runs"] if r["contender"] == "one" and r["phase"] == phase}
            ratio = [r["wall_s"] / ones[r["round"]]["wall_s"] for r in mine]
            tune_ratio = [r["tune_s"] / ones[r["round"]]["tune_s"] for r in mine]
            result["summary"][f"{which}/{phase}"] = {
                "wall_ratio": round(statistics.median(ratio), 3), "tune_ratio": round(statistics.median(tune_ratio), 3),
                "bar": round(1 / (0.8 * n), 3), "worst_slowdown": max(r["worst_slowdown"] for r in mine),
                "same_winner": f"{sum(r['same_winner'] for r in mine)}/{sum(r['shapes'] for r in mine)}"}
            print(f"{which:12s} {phase}: {result['summary'][f'{which}/{phase}']}")
    if args.out:
        write_results(args.out, result)


if __name__ == "__main__":
    main()
