"""A transformers Llama trained and served with and without `cuteforge.patch`, eager and
under torch.compile.

The model is built from a config with random weights (no download), bf16 on the GPU:
``small`` is hidden 1024 x 4 layers, ``large`` hidden 4096 x 2 layers; both with vocab
128256 and sequence 2048 (batch 2). Contenders share the weights (the patched model is a
copy of the stock one, patched) and the inputs, and run in interleaved rounds:

- training step: forward with labels (the causal-LM loss), backward; grads cleared
  between steps (no optimizer);
- inference: a forward without labels under ``torch.no_grad``.

Per contender: ms a step (wall, the GPU synchronized at the end of each round), host ms
(the step's call returning, before the GPU finishes), peak memory above the weights (MB),
and for the patched model the loss and gradient agreement with stock, eager and compiled
(relative error of the flattened gradients) and torch._dynamo.explain's graph-break count;
``agreement_fp32``: every contender's against the same model in fp32, the scale bf16's own
rounding sets (stock compiled against stock eager differs by more than 1 %).

    python benchmarks/bench_model.py --size small [--size large] [--reduce-overhead] [--loss-variants] [--mlp] [--residual-norm] [--no-cache] [--out FILE]
    python benchmarks/bench_model.py --plot-from benchmarks/results/h200-model.json  # redraw its PNG

"patched" is the model after `cuteforge.patch(model)` with its defaults: in eager mode
cuteforge's cross-entropy on the materialized logits, under torch.compile the fused
LM-head loss (`fused_loss="compiled"`). "patched-kernels" is the patched model with
transformers' causal mask kept under torch.compile (`patch(causal_attention=False)`,
compiled rows only): what cuteforge's kernels give alone. `--loss-variants` adds the
other loss in each mode: eager with the fused loss ("patched-fused",
`fused_loss=True`), compiled without it ("patched-unfused", `fused_loss=False`);
`--mlp` adds the model with the MLP swapped too (`patch(mlp=True)`: the projections and
their gradients on cuteforge GEMMs); `--residual-norm` adds it with the residual add in
each post-attention norm ("patched-residual", `patch(residual_norm=True)`); `--profile` adds each contender's top CUDA
kernels (`--profile-top N` of them) and kernel time a step, training and inference, over
`--per-round` consecutive profiled steps, with the time the GPU was busy against the span
of those steps (a GPU that waits on the host or on a sync shows a span above its busy
time). Each phase (profile, timed training rounds, timed inference rounds) also records
the SM clock and board power nvidia-smi sampled while it ran (``gpu_clocks``): a
sustained large step holds the board at its power limit, below its boost clock.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import cuteforge.nn as cnn
from cuteforge.bench.report import results_header, write_results
from cuteforge.timing.clocks import ClockSampler

OUT = Path(__file__).with_name("results")
SIZES = {"small": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
                   "num_key_value_heads": 8},
         "large": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 2, "num_attention_heads": 32,
                   "num_key_value_heads": 8}}
VOCAB, SEQ, BATCH = 128256, 2048, 2


def _model(size: str, use_cache: bool = True) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=SEQ, rms_norm_eps=1e-6, use_cache=use_cache,
                         **SIZES[size])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)


def _train_step(model: Callable[..., Any], params: list[torch.nn.Parameter], ids: torch.Tensor) -> torch.Tensor:
    for p in params:
        p.grad = None
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss


def _infer_step(model: Callable[..., Any], ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _measure(steps: dict[str, Callable[[], Any]], rounds: int, per_round: int,
             params: list[torch.nn.Parameter]) -> dict[str, dict[str, float]]:
    """Interleaved rounds: per contender the median over rounds of ms a step (wall, synced
    per round) and host ms a step (the call's own time), and its peak memory in MB above
    what was allocated before the step, with every gradient of ``params`` cleared first
    (so the base holds the weights only)."""
    wall: dict[str, list[float]] = {k: [] for k in steps}
    host: dict[str, list[float]] = {k: [] for k in steps}
    peak: dict[str, float] = {}
    for name, step in steps.items():
        for p in params:
            p.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
    for _ in range(rounds):
        for name, step in steps.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            calls = 0.0
            for _ in range(per_round):
                c0 = time.perf_counter()
                step()
                calls += time.perf_counter() - c0
            torch.cuda.synchronize()
            wall[name].append((time.perf_counter() - t0) * 1e3 / per_round)
            host[name].append(calls * 1e3 / per_round)

    def median(v: list[float]) -> float:
        return sorted(v)[len(v) // 2]

    return {k: {"ms": round(median(wall[k]), 3), "host_ms": round(median(host[k]), 3), "peak_MB": round(peak[k], 1)}
            for k in steps}


def _grads(model: Callable[..., Any], params: list[torch.nn.Parameter], ids: torch.Tensor
           ) -> tuple[float, list[torch.Tensor]]:
    """One training step's loss and fp32 copies of its gradients, in parameter order (copied:
    a compiled wrapper shares its model's parameters)."""
    loss = _train_step(model, params, ids)
    return loss.item(), [torch.zeros_like(p, dtype=torch.float32) if p.grad is None else p.grad.float() for p in params]


def _error(grads: list[torch.Tensor], reference: list[torch.Tensor], names: list[str]) -> dict[str, Any]:
    """The gradients' relative error against ``reference``: over all parameters, and the worst one's."""
    num = den = 0.0
    worst, worst_name = 0.0, ""
    for g, r, name in zip(grads, reference, names):
        d, n = (g - r).norm().item(), r.norm().item()
        num, den = num + d * d, den + n * n
        if n > 0 and d / n > worst:
            worst, worst_name = d / n, name
    return {"grad_rel_err": round((num / den) ** 0.5, 5), "worst_param": worst_name,
            "grad_rel_err_worst_param": round(worst, 5)}


def _agreement(stock: Callable[..., Any], patched: Callable[..., Any], owners: tuple[torch.nn.Module, torch.nn.Module],
               ids: torch.Tensor) -> dict[str, Any]:
    """Loss difference and the gradients' relative error, ``patched`` against ``stock`` (each
    a model or its compiled wrapper; ``owners`` the models holding their parameters)."""
    names = [n for n, _ in owners[0].named_parameters()]
    assert names == [n for n, _ in owners[1].named_parameters()], "the models' parameters differ"
    ls, reference = _grads(stock, list(owners[0].parameters()), ids)
    lp, grads = _grads(patched, list(owners[1].parameters()), ids)
    return {"loss_stock": round(ls, 5), "loss_patched": round(lp, 5), "loss_abs_diff": round(abs(ls - lp), 5),
            **_error(grads, reference, names)}


def _agreement_fp32(stock: torch.nn.Module, contenders: dict[str, tuple[Callable[..., Any], torch.nn.Module]],
                    ids: torch.Tensor) -> dict[str, Any]:
    """Each contender's loss and gradients against the same model in fp32 (eager, stock):
    bf16's own rounding, stock's and torch.compile's included, is the scale any bf16
    contender's error is read against."""
    exact = copy.deepcopy(stock).float()
    names = [n for n, _ in exact.named_parameters()]
    loss, reference = _grads(exact, list(exact.parameters()), ids)
    del exact
    out: dict[str, Any] = {"loss_fp32": round(loss, 5)}
    for name, (model, owner) in contenders.items():
        lc, grads = _grads(model, list(owner.parameters()), ids)
        out[name] = {"loss_abs_diff": round(abs(lc - loss), 5), **_error(grads, reference, names)}
        del grads
    torch.cuda.empty_cache()
    return out


def _graph_breaks(model: torch.nn.Module, ids: torch.Tensor) -> int:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(input_ids=ids, labels=ids)
    torch._dynamo.reset()
    return int(explained.graph_break_count)


def _variants(loss_variants: bool, mlp: bool, residual_norm: bool = False
              ) -> dict[str, tuple[dict[str, Any], tuple[str, ...]]]:
    """The patched contenders: their `patch()` arguments and the modes they run in (a mode
    where a variant runs as "patched" does would repeat its rows)."""
    both = ("eager", "compile")
    out: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
        "patched": ({}, both),
        # cuteforge's kernels alone: transformers' causal mask kept (eager mode never
        # builds the mask)
        "patched-kernels": ({"causal_attention": False}, ("compile",))}
    if loss_variants:  # the loss patch() does not pick in each mode
        out["patched-fused"] = ({"fused_loss": True}, ("eager",))
        out["patched-unfused"] = ({"fused_loss": False}, ("compile",))
    if mlp:  # the MLP on cuteforge.nn.SwiGLUMLP too (forward and backward GEMMs on ops.gemm)
        out["patched-mlp"] = ({"mlp": True}, both)
    if residual_norm:  # the residual add before each post-attention norm in that norm
        out["patched-residual"] = ({"residual_norm": True}, both)
    return out


def busy_ms(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(busy, span) in ms of GPU activity intervals given in µs: busy is their union's
    length (overlapping work counted once), span from the first start to the last end."""
    busy, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            busy += e - max(s, end)
            end = e
    span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
    return busy / 1e3, span / 1e3


def _profile(steps: dict[str, Callable[[], Any]], top: int = 12, count: int = 3) -> dict[str, list[dict[str, Any]]]:
    """Per contender, over ``count`` consecutive steps (queued as the timed rounds queue
    them), per step: the CUDA kernels that take the most GPU time (ms), the total kernel
    time, and how long the GPU was busy against the span from the first kernel to the
    last (``gpu_busy_ms`` / ``gpu_span_ms``: where the span exceeds the busy time, the
    GPU waited; where the kernel time alone exceeds a single step's, sustained clocks
    run slower): where a contender's time goes."""
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, list[dict[str, Any]]] = {}
    for name, step in steps.items():
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(count):
                step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
        total = sum(e.self_device_time_total for e in kernels) / 1e3 / count
        busy, span = busy_ms([(e.time_range.start, e.time_range.end) for e in prof.events()
                              if e.device_type == torch.autograd.DeviceType.CUDA])
        out[name] = [{"kernel": "(all)", "ms": round(total, 3), "calls": sum(e.count for e in kernels) // count,
                      "gpu_busy_ms": round(busy / count, 3), "gpu_span_ms": round(span / count, 3),
                      "steps": count}] + [
            {"kernel": e.key[:120], "ms": round(e.self_device_time_total / 1e3 / count, 3), "calls": e.count // count}
            for e in kernels[:top]]
    return out


def run_size(size: str, reduce_overhead: bool, loss_variants: bool, rounds: int, per_round: int, mlp: bool = False,
             profile: bool = False, profile_top: int = 12, use_cache: bool = True,
             residual_norm: bool = False) -> dict[str, Any]:
    stock = _model(size, use_cache)
    patched = copy.deepcopy(stock)
    report = cnn.patch(patched)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    row: dict[str, Any] = {"size": size, **SIZES[size], "vocab": VOCAB, "seq": SEQ, "batch": BATCH, "use_cache": use_cache,
                           "patch": str(report)}
    row["agreement"] = _agreement(stock, patched, (stock, patched), ids)
    row["graph_breaks_patched"] = _graph_breaks(patched, ids)
    models = {"stock eager": stock, "stock compile": torch.compile(stock), "patched eager": patched,
              "patched compile": torch.compile(patched)}
    if reduce_overhead:
        models["stock reduce-overhead"] = torch.compile(stock, mode="reduce-overhead")
        models["patched reduce-overhead"] = torch.compile(patched, mode="reduce-overhead")
    owners = {k: stock if k.startswith("stock") else patched for k in models}
    for variant, (kwargs, modes) in _variants(loss_variants, mlp, residual_norm).items():
        if variant == "patched":
            continue
        model = copy.deepcopy(stock)
        cnn.patch(model, **kwargs)
        for mode in modes:
            models[f"{variant} {mode}"] = model if mode == "eager" else torch.compile(model)
            owners[f"{variant} {mode}"] = model
    params = {k: list(m.parameters()) for k, m in owners.items()}
    train = {k: (lambda m=m, ps=params[k]: _train_step(m, ps, ids)) for k, m in models.items()}
    # without labels the loss is not involved: the loss variants' rows would repeat the patched ones
    infer = {k: (lambda m=m: _infer_step(m, ids)) for k, m in models.items() if "fused" not in k}
    clocks: dict[str, Any] = {}
    if profile:
        with ClockSampler() as sampler:
            row["profile_train"] = _profile(train, profile_top, per_round)
            row["profile_infer"] = _profile(infer, profile_top, per_round)
        clocks["profile"] = sampler.summary() or {"error": sampler.error}
    for fns in (train, infer):
        for name, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            print(f"{size} {name}: warm-up (compile) {time.perf_counter() - t0:.1f} s", flush=True)
    # compiled, the patched step against the stock one (torch.compile's own rounding differs
    # from eager's: stock compiled against stock eager for scale)
    row["agreement_compiled"] = _agreement(models["stock compile"], models["patched compile"], (stock, patched), ids)
    row["agreement_stock_compiled_vs_eager"] = _agreement(stock, models["stock compile"], (stock, stock), ids)
    row["agreement_fp32"] = _agreement_fp32(stock, {k: (models[k], owners[k]) for k in (
        "stock eager", "patched eager", "patched-fused eager", "patched-residual eager", "stock compile",
        "patched compile", "patched-unfused compile", "patched-residual compile") if k in models}, ids)
    every = [p for ps in params.values() for p in ps]
    for what, fns in (("train", train), ("infer", infer)):
        with ClockSampler() as sampler:
            row[what] = _measure(fns, rounds, per_round, every)
        clocks[what] = sampler.summary() or {"error": sampler.error}
    # the SM clock and board power while each phase ran (timing/clocks.py): sustained
    # training at the power limit runs below the boost clock. The profile phase's samples
    # are mostly of the host between profiled steps, not of the steps.
    row["gpu_clocks"] = clocks
    for what in ("train", "infer"):
        r = row[what]
        for mode in ("eager", "compile", "reduce-overhead"):
            for variant in _variants(loss_variants, mlp, residual_norm):
                if f"stock {mode}" in r and f"{variant} {mode}" in r:
                    tag = mode if variant == "patched" else f"{mode} {variant.removeprefix('patched-')}"
                    r[f"speedup {tag}"] = round(r[f"stock {mode}"]["ms"] / r[f"{variant} {mode}"]["ms"], 3)
                    r[f"peak ratio {tag}"] = round(r[f"{variant} {mode}"]["peak_MB"] / max(r[f"stock {mode}"]["peak_MB"], 1e-9), 3)
    print(size, row, flush=True)
    del models, train, infer, stock, patched, owners, params
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Per size and mode, each contender's ms a step (bars, with its ratio to stock in the
    same mode: eager or compiled), its host ms (black ticks: where a tick reaches the bar's
    top the step waits on the host, not the GPU) and, with --profile, its kernels' ms a
    step over the profiled steps (hollow diamonds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 * len(rows), figsize=(5 * 2 * len(rows), 4.4), squeeze=False)
    for i, row in enumerate(rows):
        for j, what in enumerate(("train", "infer")):
            ax = axes[0][2 * i + j]
            steps = {k: v for k, v in row[what].items() if isinstance(v, dict)}
            names = list(steps)
            xs = range(len(names))
            ax.bar(xs, [steps[k]["ms"] for k in names],
                   color=["tab:gray" if k.startswith("stock") else "tab:red" for k in names])
            ax.scatter(xs, [steps[k]["host_ms"] for k in names], marker="_", s=300, color="black", zorder=3,
                       label="host ms")
            kernels = row.get(f"profile_{what}") or {}
            if kernels:
                ks = [x for x, k in zip(xs, names) if k in kernels]
                ax.scatter(ks, [kernels[k][0]["ms"] for k in names if k in kernels], marker="D", s=28,
                           facecolors="none", edgecolors="black", zorder=3, label="kernels ms a step (profiled)")
                busy = [(x, kernels[k][0]["gpu_busy_ms"]) for x, k in zip(xs, names)
                        if k in kernels and "gpu_busy_ms" in kernels[k][0]]
                if busy:
                    ax.scatter(*zip(*busy), marker="x", s=28, color="black", zorder=3, label="GPU busy ms a step")
            for x, k in zip(xs, names):
                stock = steps.get("stock " + k.rsplit(" ", 1)[-1])
                if stock and not k.startswith("stock"):
                    ax.annotate(f"{stock['ms'] / steps[k]['ms']:.2f}x", (x, steps[k]["ms"]), ha="center",
                                va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
            ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel("ms a step")
            ax.set_ylim(0, 1.1 * max(steps[k]["ms"] for k in names))  # room for the ratios
            title = f"{row['size']} ({row['hidden_size']} x {row['num_hidden_layers']}): {what}"
            clock = (row.get("gpu_clocks") or {}).get(what)
            if clock and "sm_mhz_median" in clock:  # the timed rounds' median SM clock and board power
                title += (f"\n{clock['sm_mhz_median']:.0f} MHz, {clock['power_w_median']:.0f} of "
                          f"{clock['power_limit_w']:.0f} W ({clock['samples']} samples)")
            ax.set_title(title, fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", action="append", choices=sorted(SIZES))
    p.add_argument("--reduce-overhead", action="store_true")
    p.add_argument("--loss-variants", action="store_true",
                   help="add the patched model with the loss patch() does not pick in each mode")
    p.add_argument("--mlp", action="store_true", help="add patched contenders with the MLP swapped too (patch(mlp=True))")
    p.add_argument("--residual-norm", action="store_true",
                   help="add patched contenders with the residual add in the post-attention norm (patch(residual_norm=True))")
    p.add_argument("--profile", action="store_true",
                   help="add each contender's top CUDA kernels and GPU busy time a step (over --per-round steps)")
    p.add_argument("--profile-top", type=int, default=12, help="how many kernels --profile keeps per contender")
    p.add_argument("--no-cache", action="store_true",
                   help="the models' use_cache=False (as with gradient checkpointing): transformers keeps the causal mask "
                        "under torch.compile whatever the patch does")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--plot-from", metavar="RESULTS.json", default=None,
                   help="redraw the PNG beside a results file from its figures (no GPU) and exit")
    args = p.parse_args()
    if args.plot_from:
        src = Path(args.plot_from)
        _plot(json.loads(src.read_text())["models"], src.with_suffix(".png"))
        return
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    out = Path(args.out) if args.out else OUT / f"{gpu}-model.json"
    rows = []
    for size in args.size or ["small", "large"]:  # written after each size: a run cut short keeps what it measured
        rows.append(run_size(size, args.reduce_overhead, args.loss_variants, args.rounds, args.per_round, args.mlp,
                             args.profile, args.profile_top, not args.no_cache, args.residual_norm))
        write_results(out, {**results_header(), "models": rows})
    _plot(rows, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
