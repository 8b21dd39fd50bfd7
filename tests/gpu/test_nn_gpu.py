"""cuteforge.nn and cuteforge.patch on the GPU: each module against the torch module it
replaces (odd row counts, dtypes, gradients), and a small random transformers Llama
patched against itself unpatched: the loss within bf16 rounding, gradients within 1e-2
relative error, eager and under torch.compile with no graph break."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuteforge.nn as cnn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 1000, 4097])
def test_norm_modules_match_torch_with_gradients(dtype, rows) -> None:
    n = 1000
    for ours, theirs in ((cnn.RMSNorm(n, eps=1e-6), nn.RMSNorm(n, eps=1e-6)), (cnn.LayerNorm(n), nn.LayerNorm(n))):
        theirs = theirs.to("cuda", dtype)
        with torch.no_grad():
            theirs.weight.normal_()
        ours = ours.to("cuda", dtype)
        ours.load_state_dict(theirs.state_dict())
        x = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=True)
        y, y_ref = ours(x), theirs(x)
        assert _rel(y, y_ref) < 1e-2
        dy = torch.randn_like(y)
        g = torch.autograd.grad(y, (x, ours.weight), dy)
        g_ref = torch.autograd.grad(y_ref, (x, theirs.weight), dy)
        for a, b in zip(g, g_ref):
            assert _rel(a, b) < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 1000, 65537])
def test_embedding_trains_like_torch_under_compile(dtype, tokens) -> None:
    torch.manual_seed(0)
    stock = nn.Embedding(32003, 72, padding_idx=5, device="cuda", dtype=dtype)
    mine = cnn.Embedding(32003, 72, padding_idx=5, device="cuda", dtype=dtype)
    mine.weight = stock.weight
    ids = torch.randint(0, 32003, (tokens,), device="cuda")
    ids[: tokens // 2] = ids[0]  # many tokens on one row: the backward's sums
    grads = []
    for module in (stock, mine):
        torch._dynamo.reset()
        stock.weight.grad = None
        out = torch.compile(lambda i, m=module: m(i))(ids)
        out.backward(torch.ones_like(out))
        grads.append(stock.weight.grad)
    assert grads[1].dtype == dtype and _rel(grads[1], grads[0]) <= 1e-2
    assert torch.equal(grads[1][5], torch.zeros_like(grads[1][5]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_loss_matches_torch(dtype) -> None:
    logits = torch.randn(3, 333, 32000, device="cuda", dtype=dtype, requires_grad=True)
    target = torch.randint(0, 32000, (3, 333), device="cuda")
    target[0, :5] = -100
    loss = cnn.CrossEntropyLoss()(logits, target)
    ref = F.cross_entropy(logits.float().view(-1, 32000), target.view(-1))
    assert abs(loss.float().item() - ref.item()) < 1e-2 * max(1.0, abs(ref.item()))
    (g,) = torch.autograd.grad(loss, logits)
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert _rel(g, g_ref) < 1e-2


def test_linear_with_activation_runs_the_gemm_without_grad() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    lin = cnn.Linear(1024, 2816, activation="silu").to("cuda", torch.bfloat16)
    x = torch.randn(7, 33, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert lin._gemm_applies(x)
        assert _rel(lin(x), F.silu(F.linear(x, lin.weight, lin.bias))) < 1e-2


@pytest.mark.parametrize("activation", [None, "silu", "gelu"])
@pytest.mark.parametrize("rows", [1, 7, 1000, 4097])
def test_linear_trains_on_the_gemm(monkeypatch, activation, rows) -> None:
    """With a gradient, Linear's forward and its backward's dX / dW run cuteforge GEMMs (torch's
    recompute never runs); the weight's gradient is contiguous and every gradient matches torch."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    import cuteforge.ops as ops_pkg
    launch = importlib.import_module("cuteforge.ops.gemm_launch")

    monkeypatch.setattr(launch, "_reference", lambda *a, **k: (_ for _ in ()).throw(AssertionError("torch recompute ran")))
    calls = []
    real = ops_pkg.gemm
    monkeypatch.setattr(ops_pkg, "gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    lin = cnn.Linear(264, 520, activation=activation).to("cuda", torch.bfloat16)
    ref = nn.Linear(264, 520).to("cuda", torch.bfloat16)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(rows, 264, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    g = torch.randn(rows, 520, device="cuda", dtype=torch.bfloat16)
    lin(x).backward(g)
    assert calls, "Linear did not call ops.gemm"
    acts = {None: lambda t: t, "silu": F.silu, "gelu": lambda t: F.gelu(t, approximate="tanh")}
    acts[activation](ref(x_ref)).backward(g)
    assert lin.weight.grad.is_contiguous()
    for got, want in ((x.grad, x_ref.grad), (lin.weight.grad, ref.weight.grad), (lin.bias.grad, ref.bias.grad)):
        assert _rel(got, want) < 2e-2


def test_linear_trains_under_torch_compile() -> None:
    """The GEMM's backward traces under torch.compile (AOT autograd runs it on fake tensors)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    torch.manual_seed(0)
    lin = cnn.Linear(264, 520, activation="silu").to("cuda", torch.bfloat16)
    ref = nn.Linear(264, 520).to("cuda", torch.bfloat16)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(1000, 264, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(1000, 520, device="cuda", dtype=torch.bfloat16)
    torch.compile(lin)(x).backward(g)
    F.silu(ref(x)).backward(g)
    for got, want in ((lin.weight.grad, ref.weight.grad), (lin.bias.grad, ref.bias.grad)):
        assert _rel(got, want) < 2e-2


def test_patched_mlp_trains_like_stock() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    stock = _llama()
    patched = copy.deepcopy(stock)
    cnn.patch(patched, mlp=True)
    ids = torch.randint(0, 1000, (2, 127), device="cuda")
    loss, grads = _loss_and_grads(patched, ids)
    ref, ref_grads = _loss_and_grads(stock, ids)
    _assert_matches_stock(loss, grads, ref, ref_grads)


@pytest.mark.parametrize("compiled", [False, True])
def test_patched_mlp_recompute_trains_like_stock(compiled) -> None:
    """patch(mlp="recompute"): gate and up as the gated GEMM with grad, the backward
    recomputing both products (compiled: the registered op, its backward traced)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    stock = _llama()
    patched = copy.deepcopy(stock)
    cnn.patch(patched, mlp="recompute")
    ids = torch.randint(0, 1000, (2, 127), device="cuda")
    torch._dynamo.reset()
    if compiled:  # the gated op is in the traced graph
        explained = torch._dynamo.explain(patched)(input_ids=ids, labels=ids)
        assert torch.ops.cuteforge.gated_gemm.default in {n.target for g in explained.graphs for n in g.graph.nodes}
        torch._dynamo.reset()
    run = torch.compile(patched) if compiled else patched
    for _ in range(2 if compiled else 1):
        loss, grads = _loss_and_grads(run, ids)
    ref, ref_grads = _loss_and_grads(stock, ids)
    _assert_matches_stock(loss, grads, ref, ref_grads)


def _llama(vocab: int = 1000):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)


def _assert_matches_stock(loss, grads, ref, ref_grads) -> None:
    """The loss in stock's dtype (fp32, as transformers reports it) and within bf16
    rounding of it, the gradients' relative error below 1 %."""
    assert loss.dtype == ref.dtype, (loss.dtype, ref.dtype)
    assert abs(loss.float().item() - ref.float().item()) <= 2 ** -7 * abs(ref.float().item()) + 1e-3
    num = sum(((a.float() - b.float()) ** 2).sum() for a, b in zip(grads, ref_grads) if b is not None)
    den = sum((b.float() ** 2).sum() for b in ref_grads if b is not None)
    assert (num / den).sqrt().item() < 1e-2


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize(("compiled", "fused_loss", "residual_norm"), [
    (False, "compiled", False), (False, True, False), (True, "compiled", False),
    (False, "compiled", True), (True, "compiled", True)])
def test_patched_llama_matches_stock(compiled, fused_loss, residual_norm) -> None:
    stock = _llama()
    patched = copy.deepcopy(stock)
    report = cnn.patch(patched, fused_loss=fused_loss, residual_norm=residual_norm)
    assert report.swapped.get("RMSNorm") == 5 and report.swapped.get("loss") == 1, report
    assert report.swapped.get("residual norm") == (2 if residual_norm else None), report
    ids = torch.randint(0, 1000, (2, 127), device="cuda")
    ids[0, 3] = 5
    run = torch.compile(patched, fullgraph=False) if compiled else patched
    for _ in range(2 if compiled else 1):
        loss, grads = _loss_and_grads(run, ids)
    ref, ref_grads = _loss_and_grads(stock, ids)
    _assert_matches_stock(loss, grads, ref, ref_grads)
    report.undo()
    assert type(patched.model.norm).__name__ == "LlamaRMSNorm"


@pytest.mark.parametrize("compiled", [False, True])
def test_patched_llama_fp32_weights_under_bf16_autocast(compiled) -> None:
    """Mixed-precision training with fp32 master weights (bf16 autocast, as transformers'
    Trainer with bf16=True): the patched model, the fused loss included when compiled,
    trains like stock under the same autocast, with fp32 gradients."""
    stock = _llama().float()
    patched = copy.deepcopy(stock)
    cnn.patch(patched)
    ids = torch.randint(0, 1000, (2, 127), device="cuda")
    torch._dynamo.reset()
    run = torch.compile(patched, fullgraph=True) if compiled else patched
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(2 if compiled else 1):
            loss, grads = _loss_and_grads(run, ids)
        ref, ref_grads = _loss_and_grads(stock, ids)
    assert all(g is None or g.dtype == torch.float32 for g in grads)
    _assert_matches_stock(loss, grads, ref, ref_grads)


def test_patched_llama_compiles_without_graph_breaks() -> None:
    patched = _llama()
    cnn.patch(patched)
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(patched)(input_ids=ids, labels=ids)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_residual_norm_compiles_into_the_norm_op_without_graph_breaks() -> None:
    """With ``residual_norm`` each layer's post-attention norm is the registered op with a
    residual: the add before it is not a graph op of its own."""
    patched = _llama()
    cnn.patch(patched, residual_norm=True)
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(patched)(input_ids=ids, labels=ids)
    assert explained.graph_break_count == 0, explained.break_reasons
    norms = [n for g in explained.graphs for n in g.graph.nodes if n.target is torch.ops.cuteforge.rms_norm.default]
    assert sum(n.args[2] is not None for n in norms) == 2, [n.args for n in norms]


def test_patched_llama_inference_compiles_without_graph_breaks() -> None:
    """Without grad the patched MLP takes the gated GEMM, traced as the registered op, with
    no graph break, and the compiled forward gives stock's logits."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    stock = _llama()
    patched = copy.deepcopy(stock)
    cnn.patch(patched)
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(patched)(input_ids=ids)
    assert explained.graph_break_count == 0, explained.break_reasons
    targets = {n.target for g in explained.graphs for n in g.graph.nodes}
    assert torch.ops.cuteforge.gated_gemm.default in targets
    torch._dynamo.reset()
    with torch.no_grad():
        got, want = torch.compile(patched)(input_ids=ids).logits, stock(input_ids=ids).logits
    assert _rel(got, want) < 2e-2


def test_patched_mlp_inference_matches_stock() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    stock = _llama()
    patched = copy.deepcopy(stock)
    report = cnn.patch(patched, mlp=True)
    assert report.swapped.get("MLP") == 2, report
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    with torch.no_grad():
        got, want = patched(input_ids=ids).logits, stock(input_ids=ids).logits
    assert _rel(got, want) < 2e-2
