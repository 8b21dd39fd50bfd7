"""`tune()`: pick the fastest valid config of a kernel for one problem, once, ever.

1. Candidates: `configs=` or the kernel's own `configs(spec)`, through an optional
   `prune(spec, configs)`; each is validated against the problem and the target's
   device limits, and an invalid one is dropped (logged, listed in `errors`) before
   anything compiles.
2. Store: a result recorded for this problem (see `store.py`) answers at once: no
   compile, no timing. `CUTEFORGE_AUTOTUNE=force` (or `force=True`) re-tunes;
   `CUTEFORGE_AUTOTUNE=off` returns the kernel's heuristic default without tuning.
3. Compile: candidates already in the L2 cache are loaded; the rest compile in GPU-blind
   worker processes (`pool.py`), and each is loaded, checked and given its first (warm-up)
   timing as soon as its worker finishes, while the others still compile.
4. Check: with `reference=`, every candidate's outputs are compared with the reference's;
   a candidate that fails to compile, to launch, or to match scores inf, with its reason.
5. Time: after a GPU warm-up, `rounds` interleaved rounds (every config once per round,
   the starting config rotating) of the timer; the median per config. The default timer
   replays a CUDA graph of many launches over rotated inputs (`timing/graphs.py`).
6. Record the medians, log the winner and the runner-up, return a `TuneResult`. The
   kernel's heuristic default, when timed, wins unless another config beats it by more
   than `keep_default` (2 %): on a power-limited GPU (a large GEMM on an H100) repeated
   sweeps move single configs by up to ~4 %, and a pick made on noise can run slower than
   the default elsewhere (docs/kernels/gemm.md).

Steps 3 to 5 go through the current `Measurement` (`measure.py`: tensors, compile, check,
timer), which a test swaps for a deterministic one to run the rest of the flow without a GPU.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import arch as arch_mod
from ..cache import STATS
from ..kernel import CompileSpec, Kernel
from ..timing.graphs import Timer
from .candidates import candidates, norm_params, resolve_kernel
from .measure import Measurement, measurement
from .store import Bucket, Problem, TuneStore, config_from_json, make_problem, times_from_record

log = logging.getLogger("cuteforge")
INF = float("inf")
KEEP_DEFAULT = 0.02  # the heuristic default stays unless beaten by more than this fraction


def pick(times: Mapping[Any, float], default: Any, keep_default: float = KEEP_DEFAULT) -> Any:
    """The config to use from median times (inf: failed): the fastest, or the heuristic
    `default` when it was timed and is within `keep_default` of the fastest."""
    finite = {c: t for c, t in times.items() if math.isfinite(t)}
    best = min(finite, key=finite.__getitem__)
    if default in finite and finite[default] <= finite[best] * (1.0 + keep_default):
        return default
    return best


def mode() -> str:
    """CUTEFORGE_AUTOTUNE: 'force' (always re-tune), 'off' (heuristic default) or 'on'."""
    v = os.environ.get("CUTEFORGE_AUTOTUNE", "on").strip().lower()
    return {"0": "off", "false": "off", "no": "off", "off": "off", "force": "force"}.get(v, "on")


@dataclass
class TuneResult:
    kernel: str
    problem: Problem
    best_config: Any
    times_ms: dict[Any, float] = field(default_factory=dict)  # median ms per config (inf: failed)
    errors: dict[Any, str] = field(default_factory=dict)  # config -> why it was dropped or failed
    source: str = "sweep"  # 'sweep' | 'cache' | 'off' | 'single'
    compiles: int = 0  # kernels compiled for this call (workers and this process)
    timings: int = 0  # timer samples taken
    wall_s: float = 0.0
    mode: str = ""  # the timer's: 'graph', 'events', ... ('' when nothing was timed)
    path: str | None = None  # the stored record

    @property
    def ranking(self) -> list[tuple[Any, float]]:
        return sorted(((c, t) for c, t in self.times_ms.items() if math.isfinite(t)), key=lambda ct: ct[1])

    @property
    def best_ms(self) -> float:
        return self.times_ms.get(self.best_config, INF)

    @property
    def runner_up(self) -> tuple[Any, float] | None:
        """The fastest config other than the chosen one (faster than it when the heuristic
        default was kept within `keep_default`)."""
        r = [ct for ct in self.ranking if ct[0] != self.best_config]
        return r[0] if r else None

    def summary(self) -> str:
        ru = self.runner_up
        text = f"best {self.best_config!r} {self.best_ms:.4f} ms"
        if ru is not None:
            text += f", runner-up {ru[0]!r} {ru[1]:.4f} ms ({100 * (ru[1] / self.best_ms - 1):+.1f}%)"
        return text


def _dynamic_dims(kernel: Kernel, tensors: Sequence[Any]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for arg, t in zip(kernel.signature.args, tensors):
        for sym, n in zip(arg.dims, t.shape):
            if sym not in kernel.signature.static:
                dims.setdefault(sym, int(n))
    return dims


def tune(
    kernel: Kernel | str,
    tensors: Sequence[Any] | None = None,
    params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
    *,
    configs: Sequence[Any] | None = None,
    reference: Callable[..., Any] | None = None,
    workers: int | None = None,
    force: bool = False,
    timer: Timer | None = None,
    key: Any = None,
    dims: Mapping[str, int] | None = None,
    outputs: Sequence[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    prune: Callable[[CompileSpec, list[Any]], list[Any]] | None = None,
    bucket: Bucket | None = None,
    store: TuneStore | bool | None = None,
    rounds: int = 15,
    warmup_ms: float = 200.0,
    arch: str | None = None,
    on_step: Callable[[str, Any, str], None] | None = None,
    keep_default: float = KEEP_DEFAULT,
) -> TuneResult:
    """Tune `kernel` for the problem of `tensors` (a call's arguments) and `params`.

    `reference(*tensors)` returns the expected output(s) (`outputs` names the written
    arguments; default: the last one). `timer(config, fn, input_sets) -> ms` replaces
    the GPU timer (tests). `key`/`dims` give the problem without tensors. `store=False`
    neither reads nor writes results. `workers=0` compiles in this process.
    `on_step(stage, config, detail)` reports progress ('compiled' per candidate, 'round').
    `keep_default`: the heuristic default is kept unless another config is faster by more
    than this fraction (module docstring; 0 picks the fastest).
    """
    t_start = time.perf_counter()
    k = resolve_kernel(kernel)
    params_t = norm_params(params)
    arch = arch or arch_mod.target_arch()
    tensors = list(tensors) if tensors is not None else []
    if key is None:
        key = k.signature.bind(tensors, k.name)
    problem = make_problem(k, key, params_t, dims if dims is not None else _dynamic_dims(k, tensors), arch, bucket)
    base = k.spec(key, params_t, None, arch=arch)
    how = "force" if force else mode()
    if how == "off":
        log.info("cuteforge autotune: %s: CUTEFORGE_AUTOTUNE=off, heuristic default %r", problem.describe(), base.config)
        return TuneResult(k.name, problem, base.config, source="off", wall_s=time.perf_counter() - t_start)
    cands, errors = candidates(k, base, configs, prune)
    if len(cands) <= 1:
        best = cands[0] if cands else base.config
        if not cands:
            log.warning("cuteforge autotune: %s: no valid candidate; using the default %r", problem.describe(), best)
        return TuneResult(k.name, problem, best, errors=errors, source="single", wall_s=time.perf_counter() - t_start)
    st = None if store is False else (store if isinstance(store, TuneStore) else TuneStore())
    if st is not None and how != "force":
        rec = st.load(k, problem)
        known = times_from_record(rec, cands) if rec is not None else None
        if known is not None and any(math.isfinite(t) for t in known.values()):
            best = pick(known, base.config, keep_default)
            res = TuneResult(k.name, problem, best, known, errors, "cache", wall_s=time.perf_counter() - t_start, path=rec["path"])  # type: ignore[index]
            log.info("cuteforge autotune: %s on %s: cache hit, %s [%s]", problem.describe(), rec["identity"]["gpu"], res.summary(), res.path)  # type: ignore[index]
            return res
    return _sweep(k, problem, base, cands, errors, tensors, params_t, reference, workers, timer, outputs, rtol, atol, st, rounds, warmup_ms, on_step, t_start,
                  keep_default)


def lookup(
    kernel: Kernel | str,
    key: Any,
    params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
    dims: Mapping[str, int] | None = None,
    *,
    arch: str | None = None,
    bucket: Bucket | None = None,
    store: TuneStore | None = None,
) -> Any:
    """The stored best config for a problem, or None (never tuned here, a stored config
    the kernel's `validate` hook now rejects, or CUTEFORGE_AUTOTUNE=off). No compile, no
    timing: for dispatch paths that should use a tuned config when one exists and the
    heuristic otherwise."""
    if mode() == "off":
        return None
    k = resolve_kernel(kernel)
    problem = make_problem(k, key, norm_params(params), dims or {}, arch or arch_mod.target_arch(), bucket)
    rec = (store or TuneStore()).load(k, problem)
    if rec is None:
        return None
    best = config_from_json(rec.get("best_config"), k, problem)
    if best is not None and k.validate_config is not None:
        # a record written by another version may hold a config this one cannot run:
        # the caller's heuristic then decides instead of a failed compile
        try:
            k.validate_config(k.spec(key, norm_params(params), best, arch=problem.arch), best)
        except (ValueError, TypeError, AttributeError) as e:
            log.warning("cuteforge autotune: %s: stored config %r no longer validates (%s); not used [%s]",
                        problem.describe(), best, e, rec["path"])
            return None
    if best is not None:
        log.info("cuteforge autotune: %s on %s: cache hit, best %r [%s]", problem.describe(), rec["identity"]["gpu"], best, rec["path"])
    return best


def _sweep(k: Kernel, problem: Problem, base: CompileSpec, cands: list[Any], errors: dict[Any, str], tensors: list[Any], params: tuple[tuple[str, Any], ...],
           reference: Callable[..., Any] | None, workers: int | None, timer: Timer | None, outputs: Sequence[str] | None, rtol: float | None, atol: float | None,
           st: TuneStore | None, rounds: int, warmup_ms: float, on_step: Callable[[str, Any, str], None] | None, t_start: float,
           keep_default: float) -> TuneResult:
    meas: Measurement = measurement()
    if timer is None:
        if meas.needs_gpu and arch_mod.compile_only():
            raise RuntimeError(f"tuning {k.name} needs a GPU of the target arch {problem.arch} to time on; compile only with precompile_candidates()")
        timer = meas.timer()
    step = on_step or (lambda *a: None)
    input_sets = meas.input_sets(tensors)
    expected = None
    out_idx = [k.signature.names.index(o) for o in outputs] if outputs else [len(k.signature.args) - 1]
    if reference is not None:
        expected = meas.expected(reference, tensors)
    times: dict[Any, float] = {}
    samples: dict[Any, list[float]] = {}
    fns: dict[Any, Any] = {}
    n_timed = 0
    worker_compiles, parent_before = 0, STATS.compiles
    for (_, _, c), fn, status, ms, err in meas.ready(k, [(base.key, params, c) for c in cands], problem.arch, workers):
        worker_compiles += status == "compiled"
        step("compiled", c, f"{status} {ms:.0f} ms")
        if fn is None:
            times[c], errors[c] = INF, err or "compile failed"
            log.info("cuteforge autotune: %s: %r scores inf: %s", k.name, c, errors[c])
            continue
        try:
            bad = meas.check(fn, tensors, out_idx, expected, rtol, atol, k.signature.names) if expected is not None else None
            if bad is None:
                timer(c, fn, input_sets)  # warm-up sample (the default timer captures its graph)
                n_timed += 1
        except Exception as e:
            bad = f"launch failed: {type(e).__name__}: {str(e)[:400]}"
        if bad is not None:
            times[c], errors[c] = INF, bad
            log.info("cuteforge autotune: %s: %r scores inf: %s", k.name, c, bad)
            continue
        fns[c], samples[c] = fn, []
    live = list(fns)
    if live and callable(getattr(timer, "warmup", None)):
        timer.warmup(warmup_ms)  # type: ignore[attr-defined]
    for r in range(rounds if live else 0):
        order = live[r % len(live):] + live[: r % len(live)]
        for c in order:
            if c in times:
                continue
            try:
                ms = float(timer(c, fns[c], input_sets))
                n_timed += 1
                if not math.isfinite(ms) or ms < 0:
                    raise RuntimeError(f"timer returned {ms}")
                samples[c].append(ms)
            except Exception as e:
                times[c], errors[c] = INF, f"launch failed: {type(e).__name__}: {str(e)[:400]}"
                log.info("cuteforge autotune: %s: %r scores inf: %s", k.name, c, errors[c])
        step("round", None, f"round {r + 1}/{rounds}")
    for c in live:
        if c not in times:
            times[c] = statistics.median(samples[c])
    times = {c: times[c] for c in cands if c in times}
    compiles = max(worker_compiles, STATS.compiles - parent_before)
    finite = {c: t for c, t in times.items() if math.isfinite(t)}
    res = TuneResult(k.name, problem, pick(finite, base.config, keep_default) if finite else base.config, times, errors, "sweep", compiles, n_timed,
                     mode=getattr(timer, "mode", "custom"))
    if callable(getattr(timer, "close", None)):
        timer.close()  # type: ignore[attr-defined]
    res.wall_s = time.perf_counter() - t_start
    if not finite:
        log.warning("cuteforge autotune: %s: every candidate failed (%s); using the default %r", problem.describe(),
                    "; ".join(f"{c!r}: {e}" for c, e in list(errors.items())[:3]), base.config)
        return res
    if st is not None:
        # None: the store could not be written; it keeps the result for this process and warns
        saved = st.save(k, problem, times, errors, res.best_config, extra={"wall_s": round(res.wall_s, 3), "mode": res.mode, "rounds": rounds})
        res.path = str(saved) if saved is not None else None
    log.info("cuteforge autotune: %s: swept %d configs in %.1f s (%d compiled, %d failed, %d invalid): %s", problem.describe(), len(times), res.wall_s,
             compiles, sum(not math.isfinite(t) for t in times.values()), sum(e.startswith("invalid") for e in errors.values()), res.summary())
    return res
