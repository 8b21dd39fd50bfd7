"""`patch(residual_norm=True)`: the decoder layers' residual add before the post-attention
norm runs in that norm; same losses and gradients as the stock model, eager and compiled,
and a layer whose forward is not the known one is left with the reason. fp32 on the CPU,
where cuteforge's norms hand their work to torch: this checks the plumbing (the swapped
forward, the arguments it passes on, the undo); tests/gpu/test_nn_gpu.py runs the kernels."""

from __future__ import annotations

import copy
import functools
import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import cuteforge.nn as cnn  # noqa: E402
from cuteforge.nn import residual_norm  # noqa: E402


def _model(family: str = "Llama") -> torch.nn.Module:
    config = getattr(transformers, f"{family}Config")(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return getattr(transformers, f"{family}ForCausalLM")(config)


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Qwen2", "Qwen3"])
def test_swapped_layers_match_stock_eager_and_compiled(family: str) -> None:
    stock = _model(family)
    patched = copy.deepcopy(stock)
    report = cnn.patch(patched, residual_norm=True)
    assert report.swapped.get("residual norm") == 2, str(report)
    assert all("forward" in vars(layer) for layer in patched.model.layers)
    ids = torch.randint(0, 96, (2, 16))
    loss, grads = _loss_and_grads(stock, ids)
    for run in (patched, torch.compile(patched, backend="aot_eager", fullgraph=True)):
        torch._dynamo.reset()
        got, got_grads = _loss_and_grads(run, ids)
        torch.testing.assert_close(got, loss, rtol=1e-5, atol=1e-6)
        for (name, _), a, b in zip(stock.named_parameters(), grads, got_grads):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # and with a cache, as generation calls it
        torch.testing.assert_close(patched(input_ids=ids).logits, stock(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_the_post_attention_norm_gets_the_residual() -> None:
    model = _model()
    cnn.patch(model, residual_norm=True)
    calls = []
    norm = model.model.layers[0].post_attention_layernorm
    norm.register_forward_pre_hook(lambda m, args, kwargs: calls.append(sorted(kwargs)), with_kwargs=True)
    model(input_ids=torch.randint(0, 96, (1, 8)))
    assert calls == [["residual"]]


def _attention_arguments(model: torch.nn.Module, *args, **kwargs) -> dict:
    """The keyword arguments layer 0 of ``model`` hands its attention for a call with ``args``
    and ``kwargs`` (after hidden states, position ids (0..7) and the rotary embedding)."""
    seen = {}
    layer = model.model.layers[0]
    handle = layer.self_attn.register_forward_pre_hook(
        lambda m, a, kw: seen.update({k: v for k, v in kw.items() if k != "hidden_states"}), with_kwargs=True)
    h = torch.randn(1, 8, 64)
    positions = torch.arange(8)[None]
    with torch.no_grad():
        out = layer(h, None, positions, *args, position_embeddings=model.model.rotary_emb(h, positions), **kwargs)
    handle.remove()
    assert out.shape == h.shape
    assert seen["position_ids"] is positions
    return seen


def test_positional_arguments_defaults_and_renamed_ones_reach_the_attention() -> None:
    """The layer's own forward passes every argument on to self_attn, its defaults too
    (use_cache=False), and takes the deprecated ``past_key_values`` for ``cache`` (the new
    name winning where both are given)."""
    stock = _model()
    patched = copy.deepcopy(stock)
    cnn.patch(patched, residual_norm=True)
    for which in ({"past_key_values": "old"}, {"cache": "new"}, {"past_key_values": "old", "cache": "new"}):
        caches = {k: transformers.DynamicCache(config=stock.config) for k in which.values()}
        got = [_attention_arguments(m, **{k: caches[v] for k, v in which.items()}) for m in (stock, patched)]
        assert got[0].keys() == got[1].keys() and got[0]["use_cache"] is got[1]["use_cache"] is False
        assert got[1]["cache"] is caches["new" if "cache" in which else "old"] and "past_key_values" not in got[1]
    with pytest.raises(TypeError, match="multiple values for argument 'position_ids'"):
        _attention_arguments(patched, position_ids=torch.arange(8)[None])


def test_checkpointed_layers_take_their_own_forward() -> None:
    """Under gradient checkpointing (transformers 5.24 wraps the class's forward) a swapped
    layer hands the call to that wrapper: checkpointed, unfused, the same loss and gradients."""
    stock = _model()
    patched = copy.deepcopy(stock)
    cnn.patch(patched, residual_norm=True)
    ids = torch.randint(0, 96, (2, 16))
    calls = []
    for model in (stock, patched):
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.train()
        for layer in model.model.layers:
            checkpoint = layer._gradient_checkpointing_func
            layer._gradient_checkpointing_func = lambda *a, f=checkpoint, **k: calls.append(1) or f(*a, **k)
    loss, grads = _loss_and_grads(stock, ids)
    got, got_grads = _loss_and_grads(patched, ids)
    assert len(calls) == 4  # two layers of each model
    torch.testing.assert_close(got, loss)
    for a, b in zip(grads, got_grads):
        torch.testing.assert_close(b, a)


def test_undo_and_deep_copies() -> None:
    model = _model()
    report = cnn.patch(model, residual_norm=True)
    twin = copy.deepcopy(model)
    assert twin.model.layers[0].forward.__self__ is twin.model.layers[0]  # a copy runs its own modules
    layer = model.model.layers[1]
    swapped = layer.forward
    wrapper = layer.forward = lambda *a, **k: swapped(*a, **k)  # someone's (a hook), put there after the patch
    ids = torch.randint(0, 96, (1, 8))
    with torch.no_grad():
        patched_logits = model(input_ids=ids).logits
    report.undo()
    assert "forward" not in vars(model.model.layers[0]) and vars(layer)["forward"] is wrapper
    assert type(model.model.layers[0].post_attention_layernorm).__name__ == "LlamaRMSNorm"
    with torch.no_grad():  # the wrapper still calls the swapped forward, which now hands the call to the layer's own
        torch.testing.assert_close(model(input_ids=ids).logits, patched_logits, rtol=1e-5, atol=1e-5)


def test_layers_whose_norms_were_not_swapped_are_left_with_the_reason() -> None:
    model = _model()
    report = cnn.patch(model, norm=False, residual_norm=True)
    assert "residual norm" not in report.swapped
    assert any("residual norm (2 layers)" in s and "not cuteforge's" in s for s in report.skipped), report.skipped


_LAYER = """
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from transformers.utils.deprecation import deprecate_kwarg


EXTRA = {{}}


class Layer(LlamaDecoderLayer):
    {decorator}
    def forward(self, hidden_states, attention_mask=None, {star}**kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask={mask}, **kwargs{extra})
        hidden_states = residual + {attention}
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states
"""


_KNOWN = {"decorator": "", "star": "", "mask": "attention_mask", "attention": "hidden_states", "extra": ""}


@pytest.mark.parametrize(("change", "why"), [
    ({}, None),  # the known forward: what the others change
    ({"attention": "F.dropout(hidden_states, 0.1)"}, "not the Llama decoder layer's"),
    ({"mask": "None"}, "by name"),
    ({"extra": ", **EXTRA"}, "by name"),
    ({"star": "*, scale=1.0, "}, "arguments are not"),
    ({"decorator": "@staticmethod"}, "decorator other than deprecate_kwarg"),
    ({"decorator": '@deprecate_kwarg("past", "9.0", new_name="attention_mask", raise_if_both_names=True)'},
     "decorator other than deprecate_kwarg"),
    ({"wrapped": True}, "wrapped by something other"),
])
def test_check_knows_the_forward_by_its_source(tmp_path, monkeypatch, request, change, why) -> None:
    source = _LAYER.format(**{**_KNOWN, **{k: v for k, v in change.items() if k != "wrapped"}})
    name = f"layer_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop(name, None))
    layer = importlib.import_module(name).Layer
    if change.get("wrapped"):  # a wrapper put on the class's forward at run time, which the source does not show
        inner = layer.forward
        layer.forward = functools.wraps(inner)(lambda self, *a, **k: 2 * inner(self, *a, **k))
    got, (names, renames) = residual_norm.check(layer)
    if why is None:
        assert got is None and names == ("attention_mask",) and renames == {}
    else:
        assert why in got and names == ()


def test_norms_take_a_residual_as_torch_would_add_it(monkeypatch) -> None:
    """The op gets the residual where it is x's dtype, shape and device; otherwise torch adds
    them (type promotion, broadcasting) and the op normalizes the sum. The op is recorded
    here, not run."""
    calls = []

    def op(x, w, eps, residual=None):
        calls.append(None if residual is None else residual.dtype)
        s = x if residual is None else x + residual
        y = F.rms_norm(s, (8,), w, eps)
        return y if residual is None else (y, s)

    monkeypatch.setattr("cuteforge.nn.modules._on_cuteforge", lambda x: x.dtype in (torch.float32, torch.float64))
    monkeypatch.setattr("cuteforge.ops.rms_norm", op)
    norm = cnn.RMSNorm(8, eps=1e-6)
    x = torch.randn(3, 8)
    for r, want in ((torch.randn(3, 8), [torch.float32]),  # fused
                    (torch.randn(3, 8, dtype=torch.float64), [None]),  # torch adds (a float64 sum), the op normalizes
                    (torch.randn(8), [None])):  # broadcast
        calls.clear()
        y, s = norm(x, residual=r)
        assert calls == want
        torch.testing.assert_close(s, x + r)
        torch.testing.assert_close(y, F.rms_norm(x + r, (8,), norm.weight, 1e-6))


def test_a_residual_alone_wanting_grad_keeps_the_op_under_compile(monkeypatch) -> None:
    """Compiled, with only the residual wanting a gradient (x does not, the weight is frozen),
    the op still gets both (a gradient is wanted) and the call returns the pair."""
    calls = []

    def op(x, w, eps, residual=None):
        calls.append(residual is not None)
        s = x if residual is None else x + residual
        y = F.rms_norm(s, (8,), w, eps)
        return y if residual is None else (y, s)

    monkeypatch.setattr("cuteforge.nn.modules._on_cuteforge", lambda x: True)
    monkeypatch.setattr("cuteforge.ops.rms_norm", op)
    norm = cnn.RMSNorm(8, eps=1e-6).requires_grad_(False)
    x, r = torch.randn(3, 8), torch.randn(3, 8, requires_grad=True)
    torch._dynamo.reset()
    y, s = torch.compile(lambda a, b: norm(a, residual=b), backend="eager")(x, r)
    assert calls == [True]
    torch.testing.assert_close(y, F.rms_norm(x + r, (8,), norm.weight, 1e-6))
    torch.testing.assert_close(s, x + r)


def test_norm_modules_give_the_sum_and_its_gradients_on_torch() -> None:
    x, r = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    for module, reference in ((cnn.RMSNorm(8, eps=1e-6), lambda s: F.rms_norm(s, (8,), None, 1e-6)),
                              (cnn.LayerNorm(8), lambda s: F.layer_norm(s, (8,)))):
        y, s = module(x, residual=r)
        torch.testing.assert_close(s, x + r)
        torch.testing.assert_close(y, reference(x + r))
        (y.sum() + s.sum()).backward()
        assert x.grad is not None and r.grad is not None
        torch.testing.assert_close(x.grad, r.grad)
        x.grad = r.grad = None
