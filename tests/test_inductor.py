"""cuteforge.inductor on the CPU: the version gate, enable()/disable() restoring exactly what
they change, idempotence, the pre-grad rewrite of a real Dynamo graph, the GEMM-choice gate
and the choice log (no CUDA run)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor import config, lowering
from torch._inductor.choices import InductorChoices
from torch._inductor.kernel import custom_op

import cuteforge.inductor as ci
from cuteforge.inductor import custom_ops, gemm_choices, rewrites, selection_log, support, switch

OPS = [op._opoverload for op, *_ in custom_ops.AUTOTUNED]


def _snapshot() -> dict[str, Any]:
    user = getattr(lowering, "user_lowerings", {})
    return {
        "gtc": InductorChoices.__dict__["get_template_configs"],
        "select": custom_op.autotune_select_algorithm,
        "pre": config.pre_grad_custom_pass,
        "post": config.post_grad_custom_post_pass,
        "low": [lowering.lowerings.get(op) for op in OPS],
        "user": [user.get(op) for op in OPS],
        "savers": list(selection_log._selector_cache().feedback_saver_fns),
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["gtc"] is b["gtc"] and a["select"] is b["select"] and a["pre"] is b["pre"] and a["post"] is b["post"]
            and all(x is y for x, y in zip(a["low"], b["low"])) and all(x is y for x, y in zip(a["user"], b["user"]))
            and a["savers"] == b["savers"])


@pytest.fixture(autouse=True)
def _off(monkeypatch: pytest.MonkeyPatch):
    ci.disable()
    monkeypatch.setattr(switch, "_WARNED", False)
    yield
    ci.disable()
    ci.clear_choices_log()


def test_installed_torch_is_supported() -> None:
    assert ci.unsupported_reason() is None, ci.unsupported_reason()


@pytest.mark.parametrize("version", ["2.10.0", "2.14.0+cu130", "3.0.0", "garbage"])
def test_version_gate_rejects(version: str) -> None:
    assert ci.unsupported_reason(version) is not None


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.12.1", "2.13.0+cpu"])
def test_version_gate_accepts(version: str) -> None:
    assert ci.unsupported_reason(version) is None


def test_unsupported_torch_warns_once_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.9.1")
    before = _snapshot()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert ci.enable() is False
        assert ci.enable() is False
    msgs = [str(x.message) for x in w if "cuteforge.inductor" in str(x.message)]
    assert len(msgs) == 1 and "2.9.1" in msgs[0], msgs
    assert not ci.is_enabled()
    assert _same(before, _snapshot())


def test_missing_api_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.kernel import custom_op

    monkeypatch.delattr(custom_op, "register_custom_op_autotuning")
    reason = ci.unsupported_reason()
    assert reason is not None and "register_custom_op_autotuning" in reason
    with pytest.warns(RuntimeWarning):
        assert ci.enable() is False


def test_enable_disable_restore_exactly() -> None:
    before = _snapshot()
    assert ci.enable() is True and ci.is_enabled()
    on = _snapshot()
    assert on["gtc"] is not before["gtc"] and getattr(on["gtc"], "_cuteforge", False)
    assert on["pre"] is not before["pre"] and on["post"] is not before["post"]
    assert on["select"].__wrapped__ is before["select"]
    assert all(on_low is not off for on_low, off in zip(on["low"] + on["user"], before["low"] + before["user"]) if on_low)
    table = getattr(lowering, "user_lowerings", lowering.lowerings)
    assert all(op in table for op in OPS)
    assert selection_log._feedback in selection_log._selector_cache().feedback_saver_fns
    assert ci.enable() is True  # idempotent: nothing re-wrapped
    assert _same(on, _snapshot())
    ci.disable()
    assert not ci.is_enabled()
    assert _same(before, _snapshot())
    ci.disable()  # idempotent
    assert _same(before, _snapshot())


def test_enable_keeps_and_chains_a_prior_pass() -> None:
    seen: list[str] = []

    def prior(graph: torch.fx.Graph) -> None:
        seen.append("prior")

    # config.patch, not monkeypatch: monkeypatch's undo deletes Inductor config entries
    with config.patch(pre_grad_custom_pass=prior):
        ci.enable()
        config.pre_grad_custom_pass(torch.fx.Graph())  # not autotuning: no rewrite, prior still runs
        assert seen == ["prior"]
        ci.disable()
        assert config.pre_grad_custom_pass is prior


def test_cache_key_pass_has_uuid() -> None:
    ci.enable()
    u = config.post_grad_custom_post_pass.uuid()
    assert u and "cuteforge-key" in u[0]
    assert config.pre_grad_custom_pass.uuid() != u


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(64)
        self.rn = nn.RMSNorm(64, eps=1e-6)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        a = torch.softmax(h @ h.transpose(-1, -2), dim=-1) @ h
        y = self.down(F.gelu(self.up(self.rn(a)), approximate="tanh"))
        return y + F.log_softmax(a, -1) + F.silu(self.up(x))[..., :64] + F.gelu(self.up(x))[..., :64]


def _dynamo_graph(fn: Any, *args: Any) -> torch.fx.GraphModule:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(graphs) == 1
    return graphs[0]


def _targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def test_rewrite_of_a_dynamo_graph() -> None:
    m = _Block().to(torch.bfloat16)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        gm = _dynamo_graph(m, x)
        counts = rewrites.rewrite_graph(gm.graph, require_gpu=False)
    # exact gelu (approximate="none") is not the kernel's tanh form: left alone
    assert counts == {"layer_norm": 1, "softmax": 1, "rms_norm": 1, "linear_gelu": 1, "log_softmax": 1,
                      "linear_silu": 1}, counts
    t = _targets(gm)
    assert "cuteforge_inductor.linear_bias_act.default" in t and "cuteforge_inductor.layer_norm.default" in t
    # the down-proj (no activation) and the exact-gelu Linear stay Linear (Inductor's addmm)
    assert sum(n.op == "call_function" and n.target in rewrites._LINEAR for n in gm.graph.nodes) == 2
    gm.recompile()  # well formed


def test_rewrite_leaves_training_graphs_and_gpu_check() -> None:
    m = _Block().to(torch.bfloat16)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    gm = _dynamo_graph(m, x)  # grad enabled, parameters require grad
    assert rewrites.rewrite_graph(gm.graph, require_gpu=False) == {}
    with torch.no_grad():
        gm = _dynamo_graph(m, x)
    assert rewrites.rewrite_graph(gm.graph) == {}  # CPU tensors: no sm_90 device, nothing offered


def test_rewrite_conditions() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> Any:
        return (torch.softmax(x, dim=0), torch.softmax(x.t(), -1), torch.softmax(x, -1, dtype=torch.float32),
                F.layer_norm(x, (64,), w.float(), None, 1e-5), F.relu(F.linear(x.float(), w.float().expand(8, 64))))

    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    with torch.no_grad():
        gm = _dynamo_graph(f, x, w)
    # not the last dim, non-contiguous, dtype=, fp32 weight on bf16 x, fp32 GEMM: none rewritten
    assert rewrites.rewrite_graph(gm.graph, require_gpu=False) == {}


def test_pass_rewrites_only_under_max_autotune(monkeypatch: pytest.MonkeyPatch) -> None:
    ci.enable()
    calls: list[bool] = []
    monkeypatch.setattr(rewrites, "rewrite_graph", lambda g, **k: calls.append(True) or {})
    config.pre_grad_custom_pass(torch.fx.Graph())
    assert calls == []
    with config.patch(max_autotune=True):
        config.pre_grad_custom_pass(torch.fx.Graph())
    assert calls == [True]


class _FakeInputs:
    def __init__(self, device: str, dtype: torch.dtype) -> None:
        self._device, self._dtype = torch.device(device), dtype

    def nodes(self) -> list[Any]:
        return []

    def device(self) -> torch.device:
        return self._device

    def dtypes(self) -> tuple[torch.dtype, ...]:
        return (self._dtype, self._dtype)

    def out_dtype(self) -> torch.dtype:
        return self._dtype


def test_gemm_choice_gate() -> None:
    from torch._inductor.kernel.mm import aten_mm

    with config.patch(max_autotune=True):
        # CPU device: nothing offered; a template list without the ATen mm: nothing offered
        assert gemm_choices.gemm_choice(_FakeInputs("cpu", torch.bfloat16), [aten_mm], "mm") is None
        assert gemm_choices.gemm_choice(_FakeInputs("cuda", torch.bfloat16), [], "mm") is None
        assert gemm_choices.gemm_choice(_FakeInputs("cuda", torch.bfloat16), [aten_mm], "mm_plus_mm") is None
    assert gemm_choices.gemm_choice(_FakeInputs("cuda", torch.bfloat16), [aten_mm], "mm") is None  # not autotuning


class _C:
    def __init__(self, name: str) -> None:
        self.name = name


def test_choice_log_classifies_winners() -> None:
    ci.enable()
    cf, tri, aten = _C("cuteforge_mm"), _C("triton_mm_3"), _C("mm")
    selection_log._feedback({cf: 0.5, tri: 0.7, aten: 0.6}, "mm", [], [])
    selection_log._feedback({cf: 0.9, aten: 0.6}, "addmm", [], [])
    selection_log._feedback({tri: 0.1, aten: 0.2}, "bmm", [], [])  # no cuteforge candidate: not logged
    dec, ind = _C("cuteforge_softmax"), _C("cfi_softmax_inductor_softmax_0")
    fb = _C("cuteforge_inductor_softmax_fallback")  # 2.13's name for the op's eager impl
    selection_log._feedback({dec: 0.3, fb: 0.31, ind: 0.2}, "cfi_softmax", [], [])
    selection_log._feedback({fb: 0.1, ind: 0.2}, "cfi_softmax", [], [])
    log = ci.choices_log()
    assert [e["op"] for e in log] == ["mm", "addmm", "cfi_softmax", "cfi_softmax"]
    assert [e["cuteforge_won"] for e in log] == [True, False, False, True]
    assert log[0]["inductor_best"] == "mm" and log[0]["cuteforge_best_ms"] == 0.5
    assert log[2]["cuteforge_best"] == "cuteforge_softmax"
    assert log[2]["winner"] == "cfi_softmax_inductor_softmax_0" and log[3]["inductor_best"] == ind.name
    ci.clear_choices_log()
    assert ci.choices_log() == []


def test_decompositions_match_torch_on_cpu() -> None:
    """The inductor_* decompositions are the torch expressions the patterns came from."""
    x = torch.randn(3, 5, 64)
    w, b = torch.randn(64), torch.randn(64)
    lw, lb = torch.randn(32, 64), torch.randn(32)
    e5, e6 = custom_ops.eps_to_bits(1e-5), custom_ops.eps_to_bits(1e-6)
    torch.testing.assert_close(custom_ops.inductor_layer_norm(x, w, b, e5), F.layer_norm(x, (64,), w, b, 1e-5))
    torch.testing.assert_close(custom_ops.inductor_layer_norm_nobias(x, w, e5), F.layer_norm(x, (64,), w, None, 1e-5))
    torch.testing.assert_close(custom_ops.inductor_rms_norm(x, w, e6), F.rms_norm(x, (64,), w, 1e-6))
    torch.testing.assert_close(custom_ops.inductor_linear_bias_act(x, lw, lb, "gelu"), F.gelu(F.linear(x, lw, lb), approximate="tanh"))
    torch.testing.assert_close(custom_ops.inductor_linear_act(x, lw, "silu"), F.silu(F.linear(x, lw)))
    torch.testing.assert_close(custom_ops.inductor_softmax(x), torch.softmax(x, -1))
    torch.testing.assert_close(custom_ops.inductor_log_softmax(x), torch.log_softmax(x, -1))


def test_kernels_skip_the_custom_op_layers() -> None:
    """What Inductor calls for a cuteforge choice: plain functions (no dispatcher, no
    benchmark module), the GEMM ones and the custom-op selections' alike, registered in
    extern_kernels by enable()."""
    from torch._inductor.select_algorithm import extern_kernels
    from torch._subclasses.fake_tensor import FakeTensorMode

    ci.enable()
    for op in ("mm", "addmm", "bmm", *(o for *_, o in custom_ops.AUTOTUNED)):
        choice = custom_ops.extern_choice(op)
        assert choice.to_callable() is getattr(custom_ops, f"cuteforge_{op}") is getattr(extern_kernels, f"cuteforge_{op}")
        assert not choice.use_fallback_kernel and not choice.has_out_variant
    assert not hasattr(torch.ops.cuteforge_inductor, "k_softmax")  # the old decompositions' ops are gone
    with FakeTensorMode():
        x, w, b = torch.empty(3, 5, 64), torch.empty(32, 64), torch.empty(32)
        assert custom_ops._linear_bias_act_op(x, w, b, "gelu").shape == (3, 5, 32)
        assert custom_ops._softmax_op(x).shape == x.shape


def test_custom_choice_is_bound_to_the_lowered_op() -> None:
    """The cuteforge choice of a custom-op selection takes the scalars its lowering saw,
    and only inside that selection."""
    ci.enable()
    assert switch._custom_choice("cfi_rms_norm", [], None) is None  # no lowering in progress
    switch._LOWERING.append(("cfi_rms_norm", {"eps_bits": custom_ops.eps_to_bits(1e-6)}))
    try:
        assert switch._custom_choice("cfi_softmax", [], None) is None  # another selection
    finally:
        switch._LOWERING.pop()


def _variant_name_211(self: Any, decomp: Any, kwargs: dict[str, Any]) -> str:
    """torch 2.11's SubgraphTemplate._generate_variant_name (codegen/subgraph.py), which
    puts str(value) of every scalar into the choice name unsanitized (2.13 sanitizes)."""
    if not kwargs:
        return decomp.__name__
    return f"{decomp.__name__}_" + "_".join(f"{k}_{v}" for k, v in sorted(kwargs.items()))


def _scalars(gm: torch.fx.GraphModule) -> list[tuple[Any, dict[str, Any]]]:
    """(op overload, {schema name: value}) of the scalar arguments of every cuteforge_inductor
    node, as register_custom_op_autotuning's _extract_tensor_inputs names them."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and str(n.target).startswith("cuteforge_inductor."):
            names = [a.name for a in n.target._schema.arguments]
            out.append((n.target, {k: v for k, v in zip(names, n.args) if not isinstance(v, torch.fx.Node)}))
    return out


def test_choice_names_are_identifiers() -> None:
    """Every scalar the rewrite passes prints identifier-safe, so the choice names (and the
    benchmark graphs and buffers named after them) compile on 2.11, which does not sanitize,
    and on 2.13, which does."""
    from torch._inductor.codegen.subgraph import SubgraphTemplate

    m = _Block().to(torch.bfloat16)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        gm = _dynamo_graph(m, x)
        rewrites.rewrite_graph(gm.graph, require_gpu=False)
    found = _scalars(gm)
    assert {str(op) for op, _ in found} >= {"cuteforge_inductor.layer_norm.default", "cuteforge_inductor.rms_norm.default",
                                             "cuteforge_inductor.softmax.default"}
    decomps = {op._opoverload: (name, ds) for op, name, ds, _ in custom_ops.AUTOTUNED}
    template = SubgraphTemplate(name="t")
    for op, kwargs in found:
        name, ds = decomps[op]
        for d in ds:
            raw = _variant_name_211(None, d, kwargs)
            # what SubgraphChoiceCaller compiles: graph "benchmark_<choice>", buffers "<graph>_buf0"
            buf = f"benchmark_{name}_{raw}_0_buf0".replace("::", "_").replace(".", "_")
            assert buf.isidentifier(), buf
            # the installed torch's own name for it is an identifier too (2.13 sanitizes)
            assert f"benchmark_{name}_{template._generate_variant_name(d, kwargs)}_0_buf0".isidentifier()
    # eps round-trips exactly, including the dtype-dependent default of rms_norm
    for eps in (1e-5, 1e-6, float(torch.finfo(torch.bfloat16).eps), 0.0):
        assert custom_ops.bits_to_eps(custom_ops.eps_to_bits(eps)) == eps and custom_ops._name_safe(custom_ops.eps_to_bits(eps))
    assert rewrites._eps_arg(-1e-5) is None and rewrites._eps_arg(float("nan")) is None and rewrites._eps_arg(True) is None


def test_end_to_end_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The whole path through a real torch.compile(max-autotune) on the CPU: the pre-grad
    rewrite, register_custom_op_autotuning's selection between the inductor_* decomposition
    and the op's eager impl (which, with no CUDA, falls back to torch), and the choice log.
    The device gate and the cuteforge extern choices (CUDA-only) are patched out.

    Choice naming is torch 2.11's (unsanitized): with a float eps in the op's arguments
    the inductor_* choice's benchmark module was a SyntaxError there (the H200 run's
    NoValidChoicesError); here every choice must time finite."""
    from torch._inductor.codegen.subgraph import SubgraphTemplate

    monkeypatch.setattr(support, "sm90", lambda device: True)
    monkeypatch.setattr(switch, "_custom_choice", lambda *args: None)  # the cuteforge extern choices are CUDA-only
    monkeypatch.setattr(SubgraphTemplate, "_generate_variant_name", _variant_name_211)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # no stored timings from an earlier run
    assert ci.enable()

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = torch.softmax(F.layer_norm(x, (64,), w, b, 1e-5), -1)
        return F.rms_norm(h, (64,), w, 1e-6)

    x, w, b = torch.randn(4, 64), torch.randn(64), torch.randn(64)
    torch._dynamo.reset()
    with torch.no_grad(), config.patch(fx_graph_cache=False, autotune_local_cache=False):
        got = torch.compile(f, mode="max-autotune")(x, w, b)
    torch.testing.assert_close(got, f(x, w, b))
    log = ci.choices_log()
    assert sorted(e["op"] for e in log) == ["cfi_layer_norm", "cfi_rms_norm", "cfi_softmax"], log
    for e in log:
        assert e["inductor_best"].startswith(e["op"] + "_inductor_")
        assert e["cuteforge_best"] == f"cuteforge_inductor_{e['op'][4:]}_fallback", e["cuteforge_best"]
        assert all(math.isfinite(t) for t in e["timings_ms"].values()), e["timings_ms"]
    torch._dynamo.reset()


def test_pointwise_producers_stay_with_inductor() -> None:
    """softmax / norms whose input is made by a pointwise op are left to Inductor (it
    fuses the producer; torch 2.11's custom-op autotuning cannot take an unrealized
    input); the same ops on a GEMM output or a graph input are rewritten, and so is a
    Linear + act on any input (its lowering realizes x: see the end-to-end test below)."""

    def f(x: torch.Tensor, w: torch.Tensor) -> Any:
        s = x @ x.t()
        return (torch.softmax(s * 0.5, -1), torch.softmax(s, -1), F.rms_norm(x + 1, (64,), w, 1e-6),
                F.rms_norm(x, (64,), w, 1e-6), F.relu(F.linear(F.silu(x), w.expand(8, 64))))

    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    with torch.no_grad():
        gm = _dynamo_graph(f, x, w)
    assert rewrites.rewrite_graph(gm.graph, require_gpu=False) == {"softmax": 1, "rms_norm": 1, "linear_relu": 1}


def test_linear_act_on_a_pointwise_input_end_to_end(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Linear + act whose input a pointwise op makes (an RMSNorm's output in a transformer
    block) goes through the custom-op autotuning: the wrapped lowering writes x out first,
    so layout inference has strides (an unrealized Pointwise raised NotImplementedError on
    torch 2.11). The CUDA-only cuteforge extern choice is patched out, as in
    test_end_to_end_on_cpu, and the op's eager impl computes with torch."""
    from torch._inductor.codegen.subgraph import SubgraphTemplate

    monkeypatch.setattr(support, "sm90", lambda device: True)
    monkeypatch.setattr(switch, "_custom_choice", lambda *args: None)  # the cuteforge extern choices are CUDA-only
    monkeypatch.setattr(custom_ops, "_linear_bias_act_impl", custom_ops.inductor_linear_bias_act)
    monkeypatch.setattr(gemm_choices, "gemm_choice", lambda *args: None)  # the inlined addmm's cuteforge choice is CUDA-only
    monkeypatch.setattr(SubgraphTemplate, "_generate_variant_name", _variant_name_211)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert ci.enable()

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.relu(F.linear(F.silu(x) * 2, w, b))

    x, w, b = (torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16),
               torch.randn(32, dtype=torch.bfloat16))
    torch._dynamo.reset()
    with torch.no_grad(), config.patch(fx_graph_cache=False, autotune_local_cache=False):
        got = torch.compile(f, mode="max-autotune")(x, w, b)
    torch.testing.assert_close(got, f(x, w, b), atol=0.1, rtol=0.02)
    assert [e["op"] for e in ci.choices_log()] == ["cfi_linear_bias_act"], ci.choices_log()
    torch._dynamo.reset()


def test_cuteforge_choice_wins_end_to_end_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The cuteforge ExternKernelChoice of a custom-op selection, bound to the op's scalar
    arguments, through a real torch.compile(max-autotune) on the CPU: the selection is
    made to keep only cuteforge's choice, whose kernel (extern_kernels.cuteforge_rms_norm)
    computes with torch here; the compiled graph must call it with eps_bits and give
    torch's answer."""
    from torch._inductor.codegen.subgraph import SubgraphTemplate
    from torch._inductor.select_algorithm import extern_kernels

    monkeypatch.setattr(support, "sm90", lambda device: True)
    monkeypatch.setattr(SubgraphTemplate, "_generate_variant_name", _variant_name_211)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    real = custom_op.autotune_select_algorithm

    def only_cuteforge(*args: Any, **kwargs: Any) -> Any:
        kwargs["choices"] = [c for c in kwargs["choices"] if str(c.name).startswith("cuteforge_")]
        return real(*args, **kwargs)

    monkeypatch.setattr(custom_op, "autotune_select_algorithm", only_cuteforge)  # what enable() wraps
    assert ci.enable()
    calls: list[int] = []

    def cpu_rms_norm(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
        calls.append(eps_bits)
        return custom_ops.inductor_rms_norm(x, w, eps_bits)

    monkeypatch.setattr(extern_kernels, "cuteforge_rms_norm", cpu_rms_norm)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (64,), w, 1e-6) * 2

    x, w = torch.randn(4, 64), torch.randn(64)
    torch._dynamo.reset()
    with torch.no_grad(), config.patch(fx_graph_cache=False, autotune_local_cache=False):
        got = torch.compile(f, mode="max-autotune")(x, w)
    torch.testing.assert_close(got, f(x, w))
    assert calls and set(calls) == {custom_ops.eps_to_bits(1e-6)}, calls  # the graph called it, with the op's eps
    torch._dynamo.reset()


def test_passes_pickle_with_their_uuid() -> None:
    """Every pass enable() installs is a module-level object that pickles (Inductor pickles
    the config on some versions: a local class there bypassed the FX graph cache) and keeps
    its uuid through the round trip."""
    import pickle

    from cuteforge.inductor import passes

    assert ci.enable()
    try:
        for p in (config.pre_grad_custom_pass, config.post_grad_custom_post_pass):
            assert type(p).__module__ == "cuteforge.inductor.passes" and "<locals>" not in type(p).__qualname__
            back = pickle.loads(pickle.dumps(p))
            assert type(back) is type(p) and back.uuid() == p.uuid() and p.uuid()
        assert config.pre_grad_custom_pass.rewrites == tuple(sorted(rewrites.REWRITES))
        assert isinstance(config.pre_grad_custom_pass, passes.CustomGraphPass)
    finally:
        ci.disable()


def test_pass_uuid_follows_version_rewrites_and_prior(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuteforge
    from cuteforge.inductor.passes import CuteforgeKeyPass, CuteforgePreGradPass

    every, only_softmax = CuteforgePreGradPass(), CuteforgePreGradPass(rewrites=["softmax"])
    assert every.uuid() != only_softmax.uuid()
    assert CuteforgePreGradPass(rewrites=reversed(rewrites.REWRITES)).uuid() == every.uuid()  # a set, not a list
    with pytest.raises(ValueError, match="unknown rewrite"):
        CuteforgePreGradPass(rewrites=["matmul"])
    pre, key = every.uuid(), CuteforgeKeyPass().uuid()
    monkeypatch.setattr(cuteforge, "__version__", "0.0.0-other")
    assert CuteforgePreGradPass().uuid() != pre and CuteforgeKeyPass().uuid() != key

    class Known(passes_base()):  # type: ignore[misc]
        def __call__(self, graph: torch.fx.Graph) -> None:
            pass

        def uuid(self) -> Any:
            return "known-1"

    assert CuteforgeKeyPass(Known()).uuid() != CuteforgeKeyPass().uuid()
    assert CuteforgeKeyPass(lambda g: None).uuid() is None  # a prior the cache cannot key: as Inductor treats it
    assert CuteforgePreGradPass(lambda g: None).uuid() is None


def passes_base() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


def test_only_the_enabled_rewrites_apply() -> None:
    m = _Block().to(torch.bfloat16)
    with torch.no_grad():
        gm = _dynamo_graph(m, torch.randn(4, 8, 64, dtype=torch.bfloat16))
    counts = rewrites.rewrite_graph(gm.graph, require_gpu=False, only=["softmax", "rms_norm"])
    assert set(counts) == {"softmax", "rms_norm"}, counts
    targets = " ".join(_targets(gm))
    assert "layer_norm" in targets and "cuteforge_inductor.layer_norm" not in targets


_FX_CACHE_SCRIPT = r"""
import json, sys
import torch, torch._dynamo
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor import config
import cuteforge.inductor as ci
from cuteforge.inductor import rewrites, support, switch

support.sm90 = lambda device: True  # the rewrite applies to these CPU graphs
switch._custom_choice = lambda *args: None  # the cuteforge extern choices are CUDA-only

def f(x, w, b):
    h = torch.softmax(F.layer_norm(x, (64,), w, b, 1e-5), -1)
    return F.rms_norm(h, (64,), w, 1e-6)

x, w, b = torch.randn(4, 64), torch.randn(64), torch.randn(64)
runs = []
for only in json.loads(sys.argv[1]):
    ci.disable()
    assert ci.enable(rewrites=only)
    torch._dynamo.reset()
    counters.clear()
    seen = []
    real = rewrites.rewrite_graph
    rewrites.rewrite_graph = lambda g, **kw: seen.append(real(g, **kw)) or seen[-1]
    with torch.no_grad(), config.patch(fx_graph_cache=True, max_autotune=True):
        torch.compile(f)(x, w, b)
    rewrites.rewrite_graph = real
    runs.append({"counters": dict(counters["inductor"]), "rewrote": seen})
print(json.dumps(runs))
"""


def test_fx_graph_cache_hits_with_enable(tmp_path: Any) -> None:
    """With enable(), a graph the pre-grad pass rewrote is served by Inductor's FX graph cache:
    a second compile after torch._dynamo.reset() and a compile in a fresh process hit it, and
    none bypasses it; another set of rewrites is another key (a miss, not a stale hit). CPU
    graphs with the device gate patched open, so the rewrite really runs; the cuteforge extern
    choices (CUDA) are not offered, so this covers the cache key and the pickling, not a
    graph that calls a cuteforge kernel."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), CUDA_VISIBLE_DEVICES="")
    every = json.dumps([None, None, ["layer_norm"]])

    def run(plan: str) -> list[dict[str, Any]]:
        out = subprocess.run([sys.executable, "-c", _FX_CACHE_SCRIPT, plan], env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run(every)
    fresh = run(json.dumps([None]))
    runs = [*first, *fresh]
    for r in runs:
        assert r["counters"].get("fxgraph_cache_bypass", 0) == 0, r
    assert first[0]["counters"].get("fxgraph_cache_miss") == 1 and first[0]["rewrote"] == [{"layer_norm": 1, "softmax": 1, "rms_norm": 1}]
    assert first[1]["counters"].get("fxgraph_cache_hit") == 1, first[1]
    assert first[2]["counters"].get("fxgraph_cache_miss") == 1 and first[2]["rewrote"] == [{"layer_norm": 1}], first[2]
    assert fresh[0]["counters"].get("fxgraph_cache_hit") == 1, fresh[0]
