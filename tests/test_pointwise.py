"""CPU checks of the pointwise kernels (SwiGLU activation, rotary embedding), their ops'
argument errors and torch.compile traces, and `patch`'s swaps for them.

sm_90a compiles run without a GPU (``CUTE_DSL_ARCH=sm_90a``): codegen and the vector
width each layout gets are checked here; numerics are checked on the GPU
(tests/gpu/test_pointwise_gpu.py).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import cuteforge.nn as cnn
from cuteforge import compiler, kernels, ops
from cuteforge.kernel import Kernel
from cuteforge.kernels.pointwise import rotary_embedding, silu_mul, silu_mul_backward
from cuteforge.kernels.pointwise.spec import silu_mul_tiling
from cuteforge.nn import decoder_call
from cuteforge.nn import rotary as cnn_rotary

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402


def _global_accesses(kernel, tensors, **params) -> set[str]:
    key = kernel.signature.fresh_key(tensors)
    spec = kernel.spec(key, kernel.key_params(sorted(params.items())), arch="sm_90a")
    ptx = compiler.compile_jit(kernel.builder(spec), kernel.signature.fake_args(key), "sm_90a", True).ptx
    return set(re.findall(r"(?:ld|st)\.global[.\w]*", ptx))


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_silu_mul_moves_16_byte_vectors_with_a_tail(dtype) -> None:
    rows = _meta(64, 1000, dtype=dtype)
    fwd = _global_accesses(silu_mul, (rows,) * 3, **silu_mul_tiling(1000))
    bwd = _global_accesses(silu_mul_backward, (rows,) * 5, **silu_mul_tiling(1000))
    for accesses in (fwd, bwd):
        assert any(a.startswith("ld.global.v4") for a in accesses), accesses
        assert any(a.startswith("st.global.v4") for a in accesses), accesses


def test_silu_mul_takes_narrower_vectors_for_odd_rows() -> None:
    odd = _meta(64, 1001)[:, 1:]  # rows of 1000 starting 2 bytes off 16: scalar access only
    accesses = _global_accesses(silu_mul, (odd, odd, _meta(64, 1000)), **silu_mul_tiling(1000))
    assert not any(".v" in a for a in accesses), accesses


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_rotary_compiles_forward_and_backward(head_dim) -> None:
    q = _meta(2, 2048, 8, head_dim).transpose(1, 2)  # (B, H, S, D) as attention layers hand it over
    k = _meta(2, 2048, 2, head_dim).transpose(1, 2)
    cos = _meta(1, 2048, head_dim).expand(2, 2048, head_dim)
    for backward in (False, True):
        accesses = _global_accesses(rotary_embedding, (q, k, cos, cos, q, k), backward=backward)
        assert accesses == {"ld.global.v4.b32", "st.global.v4.b32"}, accesses


def test_kernels_stay_reachable_by_name_after_their_device_modules_load() -> None:
    """The ops look the kernels up in the package after the builders have imported the
    device modules (`swiglu.py`, `rotary.py`), which must not shadow them."""
    q = _meta(1, 2, 4, 8)
    _global_accesses(rotary_embedding, (q, q, _meta(1, 4, 8), _meta(1, 4, 8), q, q), backward=True)
    _global_accesses(silu_mul, (_meta(2, 8),) * 3, **silu_mul_tiling(8))
    for name in kernels.pointwise.__all__:
        assert isinstance(getattr(kernels.pointwise, name), Kernel), name


def test_rotary_vectors_narrow_to_the_half_head() -> None:
    q = _meta(1, 4, 16, 12)  # half a head is 6 elements: 4-byte vectors at the widest
    accesses = _global_accesses(rotary_embedding, (q, q, _meta(1, 16, 12), _meta(1, 16, 12), q, q), backward=False)
    assert "ld.global.v4.b32" not in accesses and any(a.startswith("ld.global") for a in accesses), accesses


def test_op_arguments_are_checked_by_name() -> None:
    g = torch.randn(4, 8)
    with pytest.raises(ValueError, match="'gate' must be a CUDA tensor"):
        ops.silu_mul(g, g)
    with pytest.raises(TypeError, match="'up' has dtype float64"):
        ops.silu_mul(g, g.double())
    with pytest.raises(ValueError, match="'up' has shape"):
        ops.silu_mul(g, g[:, :4])
    with pytest.raises(TypeError, match="'gate' has dtype int64"):
        ops.silu_mul(g.long(), g.long())
    q, k, c = torch.randn(2, 4, 7, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 7, 8)
    with pytest.raises(ValueError, match="'q' must be a CUDA tensor"):
        ops.rotary_embedding(q, k, c, c)
    with pytest.raises(ValueError, match="'cos' must have shape"):
        ops.rotary_embedding(q, k, c[:, :5], c)
    with pytest.raises(ValueError, match="'k' has shape"):
        ops.rotary_embedding(q, k[:, :, :3], c, c)
    with pytest.raises(ValueError, match="head dim 7"):
        ops.rotary_embedding(q[..., :7], k[..., :7], c[..., :7], c[..., :7])
    with pytest.raises(ValueError, match="'unsqueeze_dim' must be 1"):
        ops.rotary_embedding(q, k, c, c, unsqueeze_dim=0)
    with pytest.raises(TypeError, match="'sin' has dtype float16"):
        ops.rotary_embedding(q, k, c, c.half())
    with pytest.raises(ValueError, match="'q' must be 4-D"):
        ops.rotary_embedding(q[0], k, c, c)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_torch_expressions_for_a_cos_with_grad_and_for_forward_ad(unsqueeze_dim) -> None:
    """A cos that wants a gradient takes transformers' expression, for either layout (so a
    CPU call computes, as it did before the eager C path); under forward-mode AD both ops
    are torch's expressions, which carry the tangents (the kernels would drop them)."""
    import torch.autograd.forward_ad as fwAD

    q, k = torch.randn(2, 4, 7, 8), torch.randn(2, 2, 7, 8)
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = torch.randn(1, 7, 8, requires_grad=True), torch.randn(1, 7, 8)
    got = ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim)
    want = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    gate, up, tangent = torch.randn(3, 10), torch.randn(3, 10), torch.randn(3, 10)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(ops.silu_mul(fwAD.make_dual(gate, tangent), up)).tangent
        rq = fwAD.unpack_dual(ops.rotary_embedding(fwAD.make_dual(q, q), k, cos.detach(), sin, unsqueeze_dim)[0])
    sig = torch.sigmoid(gate)
    torch.testing.assert_close(out, tangent * up * sig * (1 + gate * (1 - sig)))
    torch.testing.assert_close(rq.tangent, rq.primal)  # linear in q: its tangent q gives the output


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_compiled_ops_trace_as_torch_expressions(unsqueeze_dim) -> None:
    """Under torch.compile the ops are their torch expressions (Inductor fuses them), equal
    to transformers' function and to F.silu(gate) * up, gradients included."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 7, 8, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, requires_grad=True)
    if unsqueeze_dim == 2:
        q, k = q.detach().transpose(1, 2).requires_grad_(), k.detach().transpose(1, 2).requires_grad_()
    cos, sin = torch.randn(2, 7, 8), torch.randn(1, 7, 8)
    torch._dynamo.reset()
    got = torch.compile(ops.rotary_embedding, backend="aot_eager", fullgraph=True)(q, k, cos, sin, unsqueeze_dim)
    want = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    gq = torch.autograd.grad(sum(t.sum() for t in got), (q, k))
    wq = torch.autograd.grad(sum(t.sum() for t in want), (q, k))
    for a, b in zip(gq, wq):
        torch.testing.assert_close(a, b)
    gate, up = torch.randn(3, 10), torch.randn(3, 10)
    got = torch.compile(ops.silu_mul, backend="aot_eager", fullgraph=True)(gate, up)
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=0, atol=0)


def _llama(**kw):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_patch_swaps_llamas_rotary_function_and_unpatch_releases_it() -> None:
    before = modeling_llama.apply_rotary_pos_emb  # ours where models of other tests hold it still
    original = getattr(before, "__wrapped__", before)
    a, b = _llama(), _llama()
    ra, rb = cnn.patch(a), cnn.patch(b)
    assert ra.swapped.get("rotary embedding") == 1 and rb.swapped.get("rotary embedding") == 1, str(ra)
    assert ra.swapped.get("MLP") == 2, str(ra)
    assert modeling_llama.apply_rotary_pos_emb.__wrapped__ is original
    cnn.unpatch(a)
    assert modeling_llama.apply_rotary_pos_emb.__wrapped__ is original  # b holds it
    cnn.unpatch(b)
    assert modeling_llama.apply_rotary_pos_emb is before


def test_the_swapped_rotary_acts_in_patched_models_calls_only(monkeypatch) -> None:
    """Another model of the type shares the modeling module's function, and gets torch's."""
    seen = []
    monkeypatch.setattr(cnn_rotary, "_takes", lambda *args: seen.append(decoder_call.in_patched_attention()) or False)
    patched, other = _llama(), _llama()
    report = cnn.patch(patched)
    ids = torch.randint(0, 96, (1, 8))
    patched(input_ids=ids)
    assert seen == [True, True]  # one call a layer
    seen.clear()
    other(input_ids=ids)
    assert seen == [False, False]
    report.undo()


class _StandInRotary(torch.autograd.Function):
    """The rotary op's autograd shape on the CPU: one node saving cos and sin."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return modeling_llama.rotate_half(q) * sin.unsqueeze(1) + q * cos.unsqueeze(1), \
            modeling_llama.rotate_half(k) * sin.unsqueeze(1) + k * cos.unsqueeze(1)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = (t.unsqueeze(1) for t in ctx.saved_tensors)
        return (gq * cos - modeling_llama.rotate_half(gq * sin), gk * cos - modeling_llama.rotate_half(gk * sin),
                None, None)


def test_gradient_checkpointing_recomputes_with_the_same_rotary(monkeypatch) -> None:
    """A layer recomputed in the backward runs outside the decoder's call; it must take the
    forward's function again, or checkpointing finds other saved tensors and raises."""
    monkeypatch.setattr(cnn_rotary, "_takes", lambda *args: decoder_call.in_patched_attention())
    monkeypatch.setattr(ops, "rotary_embedding", lambda q, k, cos, sin, unsqueeze_dim=1: _StandInRotary.apply(
        q, k, cos, sin))
    stock = _llama()
    model = copy.deepcopy(stock)
    report = cnn.patch(model)
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, 96, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    stock(input_ids=ids, labels=ids).loss.backward()
    for (name, a), b in zip(stock.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
    report.undo()


def test_a_deep_copy_of_a_patched_model_runs_its_own_modules() -> None:
    model = _llama()
    cnn.patch(model, fused_loss=True)
    twin = copy.deepcopy(model)  # an EMA or reference model
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    ids = torch.randint(0, 96, (1, 8))
    assert not torch.allclose(twin(input_ids=ids).logits, model(input_ids=ids).logits)
    assert twin.forward.__self__ is twin
    with pytest.raises(ValueError, match="a copy of a patched model"):
        cnn.unpatch(twin)
    cnn.unpatch(model)
    assert "forward" not in vars(model) and "_cuteforge_fused_loss" not in vars(model)


class _MyLlama(transformers.LlamaForCausalLM):
    """A user's subclass, defined outside transformers' modeling module."""


def test_the_rotary_swap_finds_the_attention_layers_module_for_a_subclass() -> None:
    before = modeling_llama.apply_rotary_pos_emb
    original = getattr(before, "__wrapped__", before)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = _MyLlama(config)
    report = cnn.patch(model)
    assert report.swapped.get("rotary embedding") == 1, str(report)
    assert modeling_llama.apply_rotary_pos_emb.__wrapped__ is original
    report.undo()
    assert modeling_llama.apply_rotary_pos_emb is before


def _modeling_module(monkeypatch, rotary_fn):
    """A stand-in modeling module holding ``rotary_fn``, and a model class defined in it."""
    module = types.ModuleType("stand_in_modeling")
    module.apply_rotary_pos_emb = rotary_fn
    monkeypatch.setitem(sys.modules, module.__name__, module)
    model_type = type("StandInModel", (torch.nn.Module,), {"__module__": module.__name__})
    return module, model_type


def _rotate(q, k, cos, sin, unsqueeze_dim=1):
    return q, k


def test_the_last_hold_puts_the_function_back_unless_replaced_since(monkeypatch) -> None:
    module, model_type = _modeling_module(monkeypatch, _rotate)
    _, undo_a = cnn_rotary.swap(model_type())
    _, undo_b = cnn_rotary.swap(model_type())
    assert module.apply_rotary_pos_emb.__wrapped__ is _rotate
    undo_a()
    undo_a()  # once only
    assert module.apply_rotary_pos_emb is not _rotate
    undo_b()
    assert module.apply_rotary_pos_emb is _rotate
    _, undo = cnn_rotary.swap(model_type())
    theirs = lambda q, k, cos, sin, unsqueeze_dim=1: (k, q)  # noqa: E731
    module.apply_rotary_pos_emb = theirs  # someone else's patch after ours
    why, _ = cnn_rotary.swap(model_type())
    assert "replaced since" in why
    undo()
    assert module.apply_rotary_pos_emb is theirs  # not put back over theirs


def test_a_rotary_function_of_another_signature_is_left_with_a_reason(monkeypatch) -> None:
    module, model_type = _modeling_module(monkeypatch, lambda q, k, cos, sin, scale=1: (q, k))
    why, undo = cnn_rotary.swap(model_type())
    assert undo is None and "takes (q, k, cos, sin, scale)" in why
    # transformers' older form, with an unused position_ids, is taken with its parameters
    module.apply_rotary_pos_emb = lambda q, k, cos, sin, position_ids=None, unsqueeze_dim=1: (q, k)
    why, undo = cnn_rotary.swap(model_type())
    assert undo is not None and list(inspect.signature(module.apply_rotary_pos_emb).parameters) == [
        "q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"]
    x = torch.randn(1, 1, 2, 4)
    assert module.apply_rotary_pos_emb(x, x, x[0], x[0], None, 1) == (x, x)  # CPU: the module's own
    undo()


def test_patched_model_on_the_cpu_matches_stock_with_the_mlp_modes() -> None:
    """CPU tensors go to torch's functions: the default patch (MLP activation, rotary) and
    mlp=True give stock's loss; the MLP keeps its state_dict keys and Parameters."""
    stock = _llama()
    ids = torch.randint(0, 96, (2, 12))
    want = stock(input_ids=ids, labels=ids).loss
    for mlp in ("activation", True, "recompute"):
        model = copy.deepcopy(stock)
        keys = model.state_dict().keys()
        gate = model.model.layers[0].mlp.gate_proj
        report = cnn.patch(model, mlp=mlp)
        mlp_module = model.model.layers[0].mlp
        assert (mlp_module.gate_proj is gate) is (mlp is not True)  # torch's projections: the model's own
        assert isinstance(mlp_module, cnn.SwiGLUMLP) and mlp_module.gemm is (mlp is True), report
        assert mlp_module.recompute is (mlp == "recompute")
        assert type(mlp_module.gate_proj) is (cnn.Linear if mlp is True else torch.nn.Linear)
        assert model.state_dict().keys() == keys
        torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, want)
        cnn.unpatch(model)
    with pytest.raises(ValueError, match="mlp must be True, False, 'activation' or 'recompute'"):
        cnn.patch(copy.deepcopy(stock), mlp="gemm")


def test_swiglu_mlp_arguments_and_cpu_fallback() -> None:
    """`recompute` is checked like `gemm`; on the CPU every setting runs torch's MLP; a
    projection with a hook is never bypassed by the gated GEMM."""
    with pytest.raises(TypeError, match="'recompute' must be a bool"):
        cnn.SwiGLUMLP(8, 16, recompute="yes")
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    for gemm in (True, False):
        for recompute in (True, False):
            mlp = cnn.SwiGLUMLP(8, 16, gemm=gemm, recompute=recompute)
            assert f"recompute={recompute}" in repr(mlp)
            want = mlp.down_proj.weight @ (F.silu(mlp.gate_proj.weight @ x.T) * (mlp.up_proj.weight @ x.T))
            torch.testing.assert_close(mlp(x), want.T)
    mlp = cnn.SwiGLUMLP(8, 16, gemm=False)
    assert cnn.modules._hookless(mlp.gate_proj)
    mlp.gate_proj.register_forward_hook(lambda *_: None)
    assert not cnn.modules._hookless(mlp.gate_proj)


def test_swiglu_mlp_gated_path_applies_only_to_plain_projections(monkeypatch) -> None:
    """Where the sm_90 GEMM would run (stubbed here), the gated path still leaves alone
    projections with biases, tensor-subclass weights, hooks, and calls under autocast."""
    monkeypatch.setattr(cnn.modules, "_gemm_applies", lambda linear, x: True)
    x = torch.randn(2, 8)
    mlp = cnn.SwiGLUMLP(8, 16, gemm=False)
    assert mlp._gated_applies(x)
    assert not cnn.SwiGLUMLP(8, 16, bias=True, gemm=False)._gated_applies(x)
    with monkeypatch.context() as m:  # autocast on CUDA (not enabled on a machine without one)
        m.setattr(torch, "is_autocast_enabled", lambda device_type="cuda": device_type == "cuda")
        assert not mlp._gated_applies(x)

    class Sharded(torch.Tensor):  # stands for a quantized or distributed weight
        pass

    subclassed = cnn.SwiGLUMLP(8, 16, gemm=False)
    subclassed.up_proj.weight = torch.nn.Parameter(subclassed.up_proj.weight.detach().as_subclass(Sharded))
    assert not subclassed._gated_applies(x)
    mlp.gate_proj.register_forward_pre_hook(lambda *_: None)
    assert not mlp._gated_applies(x)


@pytest.mark.parametrize("gate", ["silu", "gelu"])
def test_gated_gemm_under_compile_is_one_op_with_a_traced_backward(monkeypatch, gate: str) -> None:
    """Under torch.compile (AOTAutograd, full graph) the MLP's gated path is the registered
    op, and its traced backward gives torch's gradients. The kernel is stood in for by its
    torch expression (no GPU here); everything around it is the real path."""
    gg = importlib.import_module("cuteforge.ops.gated_gemm")  # the module (the package exports the function)
    monkeypatch.setattr(cnn.modules, "_gemm_applies", lambda linear, x: True)
    monkeypatch.setattr(gg.checks, "on_cuda", lambda *a: None)
    monkeypatch.setattr(gg, "_forward", lambda a, bg, bu, gate, config: gg._reference(a, bg, bu, gate))
    seen: list[object] = []

    def backend(gm: torch.fx.GraphModule, example: list[torch.Tensor]):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example)

    torch.manual_seed(0)
    a, bg, bu = (t.bfloat16().requires_grad_() for t in (torch.randn(2, 5, 16), torch.randn(16, 24) / 4,
                                                          torch.randn(16, 24) / 4))
    torch._dynamo.reset()
    out = torch.compile(lambda a, bg, bu: ops.gated_gemm(a, bg, bu, gate=gate), backend=backend, fullgraph=True)(a, bg, bu)
    assert torch.ops.cuteforge.gated_gemm.default in seen
    assert out.shape == (2, 5, 24) and out.dtype == torch.bfloat16
    leaves = [t.detach().float().requires_grad_() for t in (a, bg, bu)]
    ref = gg._reference(*leaves, gate)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    g = torch.randn(out.shape)
    got = torch.autograd.grad(out, (a, bg, bu), g.bfloat16())
    want = torch.autograd.grad(ref, leaves, g)
    for x, y in zip(got, want):
        assert x.dtype == torch.bfloat16
        torch.testing.assert_close(x.float(), y, atol=5e-2, rtol=2e-2)
    # frozen weights: the traced backward gives a's gradient alone
    frozen = torch.compile(lambda a, bg, bu: ops.gated_gemm(a, bg, bu, gate=gate), backend=backend, fullgraph=True)
    out = frozen(a, bg.detach(), bu.detach())
    (ga,) = torch.autograd.grad(out, (a,), g.bfloat16())
    torch.testing.assert_close(ga.float(), want[0], atol=5e-2, rtol=2e-2)

    # the module: without grad, and with grad under recompute=True, the gate and up run as the op
    mlp = cnn.SwiGLUMLP(16, 24, gemm=False, recompute=True).bfloat16()
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    for grad in (False, True):
        seen.clear()
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            y = torch.compile(mlp, backend=backend, fullgraph=True)(x)
        assert torch.ops.cuteforge.gated_gemm.default in seen
        assert y.requires_grad is grad
        torch.testing.assert_close(y, mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)), atol=2e-2, rtol=2e-2)
    torch._dynamo.reset()
