"""`patch(residual_norm=True)`: the decoder layers' residual add before the post-attention
norm runs in that norm; same losses and gradients as the stock model, eager and compiled,
and a layer whose forward is not the known one is left with the reason. fp32 on the CPU,
where cuteforge's norms hand their work to torch: this checks the plumbing (the swapped
forward, the arguments it passes on, the undo); tests/gpu/test_nn_gpu.py runs the kernels."""

from __future__ import annotations

import copy
import importlib

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


def test_positional_arguments_defaults_and_renamed_ones_reach_the_attention() -> None:
    """The layer's own forward passes every argument on to self_attn, its defaults too
    (use_cache=False), and takes the deprecated ``past_key_values`` for ``cache``."""
    stock = _model()
    patched = copy.deepcopy(stock)
    cnn.patch(patched, residual_norm=True)
    seen = []
    for model in (stock, patched):
        layer = model.model.layers[0]
        layer.self_attn.register_forward_pre_hook(
            lambda m, args, kwargs: seen.append({k: v for k, v in kwargs.items() if k != "hidden_states"}),
            with_kwargs=True)
        h = torch.randn(1, 8, 64)
        position_embeddings = model.model.rotary_emb(h, torch.arange(8)[None])
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            out = layer(h, None, torch.arange(8)[None], past_key_values=cache, position_embeddings=position_embeddings)
        assert out.shape == h.shape
    assert seen[0].keys() == seen[1].keys() and seen[0]["use_cache"] is seen[1]["use_cache"] is False
    assert seen[1]["cache"] is not None and "past_key_values" not in seen[1]


def test_undo_and_deep_copies() -> None:
    model = _model()
    report = cnn.patch(model, residual_norm=True)
    twin = copy.deepcopy(model)
    assert twin.model.layers[0].forward.__self__ is twin.model.layers[0]  # a copy runs its own modules
    report.undo()
    assert not any("forward" in vars(layer) for layer in model.model.layers)
    assert type(model.model.layers[0].post_attention_layernorm).__name__ == "LlamaRMSNorm"


def test_layers_whose_norms_were_not_swapped_are_left_with_the_reason() -> None:
    model = _model()
    report = cnn.patch(model, norm=False, residual_norm=True)
    assert "residual norm" not in report.swapped
    assert any("residual norm (2 layers)" in s and "not cuteforge's" in s for s in report.skipped), report.skipped


_LAYER = """
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaDecoderLayer


class Layer(LlamaDecoderLayer):
    {decorator}
    def forward(self, hidden_states, attention_mask=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask={mask}, **kwargs)
        hidden_states = residual + {attention}
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states
"""


@pytest.mark.parametrize(("decorator", "mask", "attention", "why"), [
    ("", "attention_mask", "hidden_states", None),  # the known forward: what the others change
    ("", "attention_mask", "F.dropout(hidden_states, 0.1)", "not the Llama decoder layer's"),
    ("", "None", "hidden_states", "by name"),
    ("@staticmethod", "attention_mask", "hidden_states", "decorator other than deprecate_kwarg"),
])
def test_check_knows_the_forward_by_its_source(tmp_path, monkeypatch, decorator, mask, attention, why) -> None:
    source = _LAYER.format(decorator=decorator, mask=mask, attention=attention)
    name = f"layer_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    layer = importlib.import_module(name).Layer
    got, (names, renames) = residual_norm.check(layer)
    if why is None:
        assert got is None and names == ("attention_mask",) and renames == {}
    else:
        assert why in got and names == ()


def test_norms_take_a_residual_as_torch_would_add_it() -> None:
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
