"""Autotuning: validated candidates, GPU-blind parallel compilation, CUDA-graph timing,
results persisted per (kernel source, problem, GPU, DSL version).

    from cuteforge.autotune import tune
    res = tune("row_reduce", (x, out), {"op": "sum"}, reference=lambda x, out: x.sum(-1))
    res.best_config, res.times_ms, res.errors

`CUTEFORGE_AUTOTUNE=force|off`, `CUTEFORGE_COMPILE_WORKERS=N`, `CUTEFORGE_COMPILE_START=
spawn|forkserver`. Results and log lines go to `logging.getLogger("cuteforge")` (INFO).
"""

from ..timing.graphs import GraphTimer, make_input_sets
from .candidates import (
    VALIDATORS,
    candidates,
    iter_ready,
    precompile_candidates,
    precompile_problems,
    register_validator,
    validate_config,
)
from .measure import Measurement, measurement, use_measurement
from .pool import CompileJob, CompileOutcome, CompilePool, compile_all, default_workers
from .store import Problem, TuneStore, make_problem, pow2_bucket
from .tuner import TuneResult, lookup, mode, tune

__all__ = [
    "VALIDATORS",
    "CompileJob",
    "CompileOutcome",
    "CompilePool",
    "GraphTimer",
    "Measurement",
    "Problem",
    "TuneResult",
    "TuneStore",
    "candidates",
    "compile_all",
    "default_workers",
    "iter_ready",
    "lookup",
    "make_input_sets",
    "make_problem",
    "measurement",
    "mode",
    "pow2_bucket",
    "precompile_candidates",
    "precompile_problems",
    "register_validator",
    "tune",
    "use_measurement",
    "validate_config",
]
