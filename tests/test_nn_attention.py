"""`patch(causal_attention=True)`: a transformers Llama keeps SDPA's causal kernel under
torch.compile, with the same loss and gradients; every other mask is transformers' own."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")

import cuteforge.nn as cnn  # noqa: E402
from cuteforge.nn import attention, decoder_call  # noqa: E402


def _llama(attn: str = "sdpa") -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _attention_only(model: torch.nn.Module, **kwargs):
    return cnn.patch(model, norm=False, mlp=False, loss=False, fused_loss=False, embedding=False,
                     rotary_embedding=False, **kwargs)


def _sdpa_calls(model: torch.nn.Module, **inputs) -> list[dict]:
    """The SDPA calls' mask arguments in the graph torch.compile captures."""
    calls: list[dict] = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if "scaled_dot_product_attention" in str(node.target):
                mask = node.kwargs.get("attn_mask")
                calls.append({"mask": None if mask is None else str(mask), "is_causal": node.kwargs.get("is_causal")})
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(**inputs)
    return calls


def _assert_compiled_matches_eager(stock: torch.nn.Module, patched: torch.nn.Module, ids: torch.Tensor) -> None:
    """``patched`` compiled (aot_eager, fullgraph: no graph break) gives ``stock``'s eager loss and gradients."""
    loss = stock(input_ids=ids, labels=ids).loss
    loss.backward()
    torch._dynamo.reset()
    compiled = torch.compile(patched, backend="aot_eager", fullgraph=True)(input_ids=ids, labels=ids).loss
    compiled.backward()
    torch.testing.assert_close(compiled, loss, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(stock.named_parameters(), patched.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_patched_llama_calls_causal_sdpa_with_the_same_loss_and_gradients() -> None:
    stock = _llama()
    patched = copy.deepcopy(stock)
    report = _attention_only(patched)
    assert report.swapped == {"causal attention": 1}, str(report)
    ids = torch.randint(0, 96, (2, 16))
    # stock: transformers up to 5.17 or so builds the mask under torch.compile, later ones skip it
    stock_calls = _sdpa_calls(stock, input_ids=ids)
    patched_calls = _sdpa_calls(patched, input_ids=ids)
    assert patched_calls and len(patched_calls) == len(stock_calls)
    assert all(c["mask"] is None and c["is_causal"] is True for c in patched_calls)

    _assert_compiled_matches_eager(stock, patched, ids)


def test_a_padding_mask_is_still_built_and_undo_restores_sdpa() -> None:
    model = _llama()
    report = _attention_only(model)
    ids = torch.randint(0, 96, (2, 16))
    padded = torch.ones(2, 16, dtype=torch.long)
    padded[0, :3] = 0
    calls = _sdpa_calls(model, input_ids=ids, attention_mask=padded)
    assert calls and all(c["mask"] is not None for c in calls)
    report.undo()
    assert model.config._attn_implementation == "sdpa"
    assert _sdpa_calls(model, input_ids=ids) == _sdpa_calls(_llama(), input_ids=ids)  # transformers' own again


def test_other_attention_implementations_are_left_with_a_reason() -> None:
    model = _llama("eager")
    report = _attention_only(model)
    assert report.swapped == {}
    assert any("causal attention" in s and "'eager'" in s for s in report.skipped)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("change", [
    {"attention_mask": torch.tensor([[False, True, True, True, True, True]])},
    {"q_offset": 2, "kv_offset": 0, "q_length": 4},
    {"local_size": 3},
    {"allow_is_causal_skip": False},
    {"mask_function": masking_utils.bidirectional_mask_function},
    {"q_offset": torch.tensor(0)},  # a static cache's offset: never compared (that would branch on data)
])
def test_masks_that_are_not_plain_causal_are_transformers_own(change: dict) -> None:
    args = {"batch_size": 1, "q_length": 6, "kv_length": 6, "q_offset": 0, "kv_offset": 0,
            "mask_function": masking_utils.causal_mask_function, "attention_mask": None,
            "allow_is_causal_skip": True}
    assert attention.causal_sdpa_mask(**args) is None
    args.update(change)
    assert not attention._plain_causal(args)  # transformers may skip some of these itself (eager-mode rules)
    ours = attention.causal_sdpa_mask(**args)
    theirs = masking_utils.sdpa_mask(**args)
    if theirs is None:  # transformers skips it too (eager-mode conditions)
        assert ours is None
    else:
        assert torch.equal(ours, theirs)


def test_a_transformers_whose_mask_function_differs_is_left_alone(monkeypatch) -> None:
    def old_sdpa_mask(batch_size, cache_position, kv_length, kv_offset=0, mask_function=None, attention_mask=None):
        raise AssertionError("never called")

    monkeypatch.setattr(masking_utils, "sdpa_mask", old_sdpa_mask)
    model = _llama()
    report = _attention_only(model)
    assert report.swapped == {} and model.config._attn_implementation == "sdpa"
    assert any("q_length" in s for s in report.skipped), report.skipped


def test_the_skip_does_not_depend_on_is_exporting(monkeypatch) -> None:
    """torch 2.11 reports is_exporting() inside torch.compile: the skip must not read it.
    (Traced as transformers sees it, so its own skip does not answer instead.)"""
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    monkeypatch.setattr(masking_utils, "is_tracing", lambda *_: True)
    args = {"batch_size": 1, "q_length": 6, "kv_length": 6, "q_offset": 0, "kv_offset": 0,
            "mask_function": masking_utils.causal_mask_function, "attention_mask": None, "allow_is_causal_skip": True}
    assert attention.causal_sdpa_mask(**args) is None


def test_without_a_cache_positions_the_decoder_makes_keep_the_causal_kernel() -> None:
    """use_cache=False: transformers checks the position ids for packed sequences, which it
    cannot rule out while tracing. Positions the decoder makes itself are never packed, so
    the patched model passes create_causal_mask none: no mask, the same loss and gradients."""
    from transformers.models.llama import modeling_llama

    stock = _llama()
    stock.config.use_cache = False
    patched = copy.deepcopy(stock)
    before = modeling_llama.create_causal_mask  # ours where models of other tests hold it still
    report = _attention_only(patched)
    assert not report.skipped, report.skipped
    ids = torch.randint(0, 96, (2, 16))
    calls = _sdpa_calls(patched, input_ids=ids)
    assert calls and all(c["mask"] is None and c["is_causal"] is True for c in calls)
    _assert_compiled_matches_eager(stock, patched, ids)
    torch._dynamo.reset()
    torch.compile(patched, backend="eager", fullgraph=True)(input_ids=ids)  # no graph break (torch 2.11 too)
    assert not decoder_call.in_patched_attention() and decoder_call._CALL["config"] is None  # nothing left behind after the calls
    report.undo()
    assert modeling_llama.create_causal_mask is before and "forward" not in vars(patched.model)


def test_without_a_cache_positions_the_caller_passes_keep_transformers_mask() -> None:
    """Position ids from the caller may be packed (two sequences in a row here): the mask
    stays, and the compiled patched model honours the packing as eager stock does."""
    stock = _llama()
    stock.config.use_cache = False
    patched = copy.deepcopy(stock)
    _attention_only(patched)
    ids = torch.randint(0, 96, (2, 16))
    packed = torch.cat((torch.arange(8), torch.arange(8))).expand(2, 16)
    calls = _sdpa_calls(patched, input_ids=ids, position_ids=packed)
    assert calls and all(c["mask"] is not None for c in calls)
    want = stock(input_ids=ids, position_ids=packed, labels=ids).loss
    assert not torch.allclose(want, stock(input_ids=ids, labels=ids).loss)  # the packing matters
    torch._dynamo.reset()
    got = torch.compile(patched, backend="aot_eager")(input_ids=ids, position_ids=packed, labels=ids).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_static_cache_compiles_without_branching_on_its_offset() -> None:
    """A static cache's query offset is a tensor: the skip must not compare it (a fullgraph
    compile of the second chunk would fail on the data-dependent branch)."""
    model = _llama().eval()
    _attention_only(model)
    cache = transformers.StaticCache(config=model.config, max_cache_len=32)
    step = torch.compile(lambda ids: model(input_ids=ids, past_key_values=cache, use_cache=True).logits,
                         backend="eager", fullgraph=True)
    torch._dynamo.reset()
    with torch.no_grad():
        for _ in range(2):
            step(torch.randint(0, 96, (1, 8)))


def test_a_shared_config_is_reported_and_undo_leaves_later_choices() -> None:
    a = _llama()
    b = transformers.LlamaForCausalLM(a.config)  # one config object for both
    ra = _attention_only(a)
    rb = _attention_only(b)
    assert rb.swapped == {} and any("already" in s for s in rb.skipped), rb.skipped
    a.set_attn_implementation("eager")  # the user moves on; undo must not put "sdpa" back over it
    ra.undo()
    assert a.config._attn_implementation == "eager"


@pytest.mark.parametrize(("family", "extra"), [
    ("Llama", {}),
    ("Mistral", {"sliding_window": 8}),  # shorter than the sequence: transformers' sliding mask must stay
    ("Qwen2", {}),
    ("Qwen3", {"head_dim": 16}),
])
def test_every_supported_family_compiled_patched_matches_eager_stock(family: str, extra: dict) -> None:
    """The default patch on each model family `patch` supports, compiled, against the stock
    model in eager mode. fp32 on the CPU, where cuteforge's modules and the fused loss hand
    their work to torch: this checks the plumbing (the swaps, the masks, the traced graph)."""
    config = getattr(transformers, f"{family}Config")(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, **extra)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    stock = getattr(transformers, f"{family}ForCausalLM")(config)
    patched = copy.deepcopy(stock)
    report = cnn.patch(patched)
    assert report.swapped.get("causal attention") == 1 and report.swapped.get("RMSNorm"), str(report)
    ids = torch.randint(0, 96, (2, 16))
    _assert_compiled_matches_eager(stock, patched, ids)


def test_patched_calls_pass_the_cache_under_the_name_transformers_takes() -> None:
    """transformers 5.24 renamed `past_key_values` to `cache` and warns at the old name on
    every call, even for None: a patched model's calls (the fused loss's forward among them)
    pass it only when given, under the name the model takes."""
    import warnings

    model = _llama()
    cnn.patch(model, fused_loss=True, residual_norm=True)
    ids = torch.randint(0, 96, (1, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(input_ids=ids, labels=ids)
        with torch.no_grad():
            first = model(input_ids=ids, use_cache=True)
            cache = getattr(first, "cache", None) or first.past_key_values
            model(input_ids=ids[:, -1:], **{"cache" if hasattr(first, "cache") else "past_key_values": cache})
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize("residual_norm", [False, True])
def test_compiled_patched_llama_under_gradient_checkpointing_has_no_graph_break(residual_norm: bool) -> None:
    """A checkpointed layer is traced as one region, in which Dynamo refuses side effects:
    the attention modules' call marks must not be one (fullgraph would raise)."""
    stock = _llama()
    patched = copy.deepcopy(stock)
    cnn.patch(patched, residual_norm=residual_norm)
    for model in (stock, patched):
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.train()
    ids = torch.randint(0, 96, (2, 16))
    loss = stock(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    torch._dynamo.reset()
    compiled = torch.compile(patched, backend="aot_eager", fullgraph=True)(input_ids=ids, labels=ids, use_cache=False)
    compiled.loss.backward()
    torch.testing.assert_close(compiled.loss, loss, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(stock.named_parameters(), patched.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert decoder_call._CALL["attention"] == 0 and not decoder_call._CALL["saved"]
