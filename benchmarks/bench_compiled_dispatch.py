"""Host time of a warm call of each registered op as a compiled graph makes it, against
the same op's warm eager call and the torch op it replaces.

Inductor's generated code calls an op as ``torch.ops.cuteforge.<op>.default(...)``; that
call is timed here directly (the "registered" column), next to the eager call
(``cuteforge.ops.<op>``, one C call) and torch's op, on the same small warm inputs
(host-bound), interleaved (`timing.host_us_interleaved`: the GPU synchronized between
loops, so the host is measured). For the norms, a no-grad graph calls the op that returns
y alone ("registered_infer", against the no-grad eager call), a training graph the op that
also returns the statistics ("registered", against the eager call with grad,
"eager_grad"). For some ops torch's own op is also called the way a compiled graph calls
it (``torch.ops.aten.<op>.<overload>``), the floor of that path. The backward ops are
timed the same way; their eager counterpart runs inside the C++ autograd node and has no
call of its own to time. A profiler pass over a compiled training step adds each op's CPU
time per call there.

    python benchmarks/bench_compiled_dispatch.py [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import cuteforge.ops as ops
from cuteforge.bench.report import results_header, write_results
from cuteforge.timing import events as timing

# the modules (cuteforge.ops re-exports functions under some of their names)
ce_launch = importlib.import_module("cuteforge.ops.cross_entropy_launch")
norm_launch = importlib.import_module("cuteforge.ops.norm_launch")

OUT = Path(__file__).with_name("results")


def _forward_rows(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> dict[str, dict[str, Any]]:
    """Per op its contenders; "torch_op_overload" is torch's own op called as a compiled
    graph calls ops (torch.ops.aten.<op>.<overload>): the host cost of that call path."""
    cf, aten = torch.ops.cuteforge, torch.ops.aten
    r = torch.randn_like(x)
    xg = x.detach().clone().requires_grad_()
    rows = {
        "rms_norm": {"eager": lambda: ops.rms_norm(x, w, 1e-6), "registered": lambda: cf.rms_norm.default(x, w, None, 1e-6),
                     "registered_infer": lambda: cf.rms_norm_infer.default(x, w, 1e-6),
                     "eager_grad": lambda: ops.rms_norm(xg, w, 1e-6),
                     "torch": lambda: F.rms_norm(x, (x.shape[-1],), w, 1e-6)},
        "rms_norm residual": {"eager": lambda: ops.rms_norm(x, w, 1e-6, residual=r),
                              "registered": lambda: cf.rms_norm.default(x, w, r, 1e-6),
                              "torch": lambda: F.rms_norm(x + r, (x.shape[-1],), w, 1e-6)},
        "layer_norm": {"eager": lambda: ops.layer_norm(x, w, w, 1e-5),
                       "registered": lambda: cf.layer_norm.default(x, w, w, None, 1e-5),
                       "registered_infer": lambda: cf.layer_norm_infer.default(x, w, w, 1e-5),
                       "eager_grad": lambda: ops.layer_norm(xg, w, w, 1e-5),
                       "torch": lambda: F.layer_norm(x, (x.shape[-1],), w, w, 1e-5),
                       "torch_op_overload": lambda: aten.native_layer_norm.default(x, [x.shape[-1]], w, w, 1e-5)},
        "softmax": {"eager": lambda: ops.softmax(x), "registered": lambda: cf.softmax.default(x, -1),
                    "torch": lambda: torch.softmax(x, -1),
                    "torch_op_overload": lambda: aten._softmax.default(x, -1, False)},
        "log_softmax": {"eager": lambda: ops.log_softmax(x), "registered": lambda: cf.log_softmax.default(x, -1),
                        "torch": lambda: torch.log_softmax(x, -1)},
        "sum": {"eager": lambda: ops.sum(x), "registered": lambda: cf.sum.default(x, -1, False),
                "torch": lambda: torch.sum(x, -1), "torch_op_overload": lambda: aten.sum.dim_IntList(x, [-1])},
        "amax": {"eager": lambda: ops.amax(x), "registered": lambda: cf.amax.default(x, -1, False),
                 "torch": lambda: torch.amax(x, -1)},
        "cross_entropy none": {"eager": lambda: ops.cross_entropy(x, t, reduction="none"),
                               "registered": lambda: cf.cross_entropy_fwd.default(x, t, -100),
                               "torch": lambda: F.cross_entropy(x, t, reduction="none")},
    }
    return rows


def _backward_rows(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> dict[str, dict[str, Any]]:
    cf = torch.ops.cuteforge
    dy = torch.randn_like(x)
    _, _, rstd = cf.rms_norm.default(x, w, None, 1e-6)
    _, _, mean, rstd_l = cf.layer_norm.default(x, w, w, None, 1e-5)
    y = cf.softmax.default(x, -1)
    _, lse = cf.cross_entropy_fwd.default(x, t, -100)
    dloss = torch.rand(x.shape[0], device=x.device)
    return {
        "rms_norm_backward": {"registered": lambda: cf.rms_norm_backward.default(dy, x, w, rstd, None)},
        "layer_norm_backward": {"registered": lambda: cf.layer_norm_backward.default(dy, x, w, mean, rstd_l, None, True)},
        "softmax_backward": {"registered": lambda: cf.softmax_backward.default(dy, y, -1),
                             "torch": lambda: torch.ops.aten._softmax_backward_data.default(dy, y, -1, x.dtype)},
        "cross_entropy_bwd": {"registered": lambda: cf.cross_entropy_bwd.default(x, t, lse, dloss, -100)},
    }


def _profile_compiled_step(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> dict[str, float]:
    """CPU time per call (profiler, total including children) of each cuteforge op in a
    compiled training step: norm, a matmul, cross-entropy, forward and backward."""
    xg = x.detach().clone().requires_grad_()
    wg = w.detach().clone().requires_grad_()
    head = torch.randn(x.shape[-1], x.shape[-1], device=x.device, dtype=x.dtype, requires_grad=True)

    def step(x: torch.Tensor, w: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        return ops.cross_entropy(ops.rms_norm(x, w, 1e-6) @ head, t)

    compiled = torch.compile(step, fullgraph=True)
    for _ in range(5):
        compiled(xg, wg, head).backward()
    torch.cuda.synchronize()
    steps = 50
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            compiled(xg, wg, head).backward()
        torch.cuda.synchronize()
    # the Python implementations must not run on warm steps: count their calls
    counts: dict[str, int] = defaultdict(int)
    patched = []
    for mod, name in ((norm_launch, "_forward"), (norm_launch, "_backward"), (ce_launch, "_fwd"), (ce_launch, "_bwd")):
        orig = getattr(mod, name)

        def counted(*a: Any, _orig: Any = orig, _key: str = f"{mod.__name__}.{name}", **k: Any) -> Any:
            counts[_key] += 1
            return _orig(*a, **k)

        setattr(mod, name, counted)
        patched.append((mod, name, orig))
    try:
        for _ in range(steps):
            compiled(xg, wg, head).backward()
        torch.cuda.synchronize()
    finally:
        for mod, name, orig in patched:
            setattr(mod, name, orig)
    print("Python implementation calls in", steps, "warm compiled steps:", dict(counts), flush=True)
    per_op: dict[str, list[float]] = defaultdict(list)
    for e in prof.key_averages():
        if e.key.startswith("cuteforge::"):
            per_op[e.key].append(e.cpu_time_total / max(e.count, 1))
    out = {k: round(sum(v) / len(v), 2) for k, v in sorted(per_op.items())}
    out["python_impl_calls_warm"] = sum(counts.values())
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 1024, (4,), device="cuda")
    forward: dict[str, dict[str, float]] = {}
    for name, fns in _forward_rows(x, w, t).items():
        for f in fns.values():
            for _ in range(3):
                f()  # compile or load, register, make the plans
        us = timing.host_us_interleaved(fns)
        forward[name] = {k: round(v, 2) for k, v in us.items()}
        forward[name]["registered_over_eager"] = round(us["registered"] / us["eager"], 3)
        if "registered_infer" in us:  # a no-grad graph's op against the no-grad call; a training graph's against grad
            forward[name]["registered_infer_over_eager"] = round(us["registered_infer"] / us["eager"], 3)
            forward[name]["registered_over_eager_grad"] = round(us["registered"] / us["eager_grad"], 3)
        print(name, forward[name], flush=True)
    backward: dict[str, dict[str, float]] = {}
    for name, fns in _backward_rows(x, w, t).items():
        for f in fns.values():
            for _ in range(3):
                f()
        backward[name] = {k: round(v, 2) for k, v in timing.host_us_interleaved(fns).items()}
        print(name, backward[name], flush=True)
    profiled = _profile_compiled_step(x, w, t)
    print("profiler, compiled step:", profiled, flush=True)
    result = {**results_header(), "shape": "bf16 (4, 1024)", "host_us_forward": forward, "host_us_backward": backward,
              "profiler_cpu_us_per_call_compiled_step": profiled}
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    write_results(args.out or OUT / f"{gpu}-compiled-dispatch.json", result)


if __name__ == "__main__":
    main()
