"""`cuteforge.patch(model)`: swap a transformers Llama-family model's norms, MLPs and loss for
cuteforge's in place, reversibly.

    report = cuteforge.patch(model)     # RMSNorm everywhere, the causal-LM loss
    print(report)                       # what was swapped, what was left and why
    report.undo()                       # or cuteforge.unpatch(model)

Supported: the model types in `SUPPORTED` (Llama, Mistral, Qwen2, Qwen3 and their
relatives that share Llama's RMSNorm / SwiGLU-MLP / loss layout). Every swapped module
keeps its parameters (the same Parameter objects, so optimizers, state_dicts and
checkpoints are unaffected).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import attention, decoder_call, residual_norm, rotary
from .modules import Embedding, RMSNorm, SwiGLUMLP, causal_lm_loss

__all__ = ["patch", "unpatch", "PatchReport", "SUPPORTED"]

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_REPORT_ATTR = "_cuteforge_patch"
_FUSED_ATTR = "_cuteforge_fused_loss"  # (compiled only, the instance forward it replaced, cache names)


@dataclass
class PatchReport:
    """What `patch` did: counts per kind of swap, modules left as they were (with why)."""

    model_type: str
    swapped: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    # the patched model (a deep copy of it copies this report, which still undoes the original)
    _model: Callable[[], Any] = field(default=lambda: None, repr=False)

    def undo(self) -> None:
        """Put every swapped module and the loss back (newest first)."""
        while self._undo:
            self._undo.pop()()
        self.swapped.clear()

    def __str__(self) -> str:
        done = ", ".join(f"{n} {k}" for k, n in self.swapped.items() if n) or "nothing"
        text = f"cuteforge.patch({self.model_type}): swapped {done}"
        return text + ("; left as they were: " + "; ".join(self.skipped) if self.skipped else "")


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if not isinstance(kind, str):
        raise TypeError(f"cuteforge.patch: expected a transformers model (with .config.model_type), got "
                        f"{type(model).__name__}")
    if kind not in SUPPORTED:
        raise ValueError(f"cuteforge.patch: model type {kind!r} is not supported (supported: {', '.join(SUPPORTED)})")
    return kind


def _swap(report: PatchReport, parent: nn.Module, name: str, old: nn.Module, new: nn.Module, kind: str) -> None:
    setattr(parent, name, new)
    report._undo.append(lambda: setattr(parent, name, old))
    report.swapped[kind] = report.swapped.get(kind, 0) + 1


def _rms_norm_of(module: nn.Module) -> RMSNorm | None:
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or not isinstance(eps, float):
        return None
    new = RMSNorm(weight.shape[0], eps=eps, device="meta")
    new.weight = weight  # the same Parameter: optimizer state and checkpoints stay valid
    return new


def _embedding_of(module: nn.Embedding) -> Embedding:
    new = Embedding(module.num_embeddings, module.embedding_dim, module.padding_idx, module.max_norm,
                    module.norm_type, module.scale_grad_by_freq, module.sparse, device="meta")
    new.weight = module.weight  # the same Parameter (a tied LM head keeps sharing it)
    return new


def _mlp_of(module: nn.Module, act: Any, gemm: bool, recompute: bool = False) -> SwiGLUMLP | None:
    projections = [getattr(module, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
    if act != "silu" or not all(type(p) is nn.Linear for p in projections):
        return None
    gate, up, down = projections
    new = SwiGLUMLP(gate.in_features, gate.out_features, bias=gate.bias is not None, device="meta", gemm=gemm,
                    recompute=recompute)
    if not gemm:  # torch's projections: the model's own modules, hooks and all
        new.gate_proj, new.up_proj, new.down_proj = gate, up, down
        return new
    for mine, theirs in zip((new.gate_proj, new.up_proj, new.down_proj), projections):
        mine.weight, mine.bias = theirs.weight, theirs.bias
    return new


def _patch_loss(model: nn.Module, report: PatchReport) -> None:
    """Point transformers' ``loss_function`` at `causal_lm_loss` (its setter keeps it in the
    instance's ``_loss_function``, which the property returns first)."""
    if not isinstance(inspect.getattr_static(type(model), "loss_function", None), property):
        report.skipped.append(f"loss: {type(model).__name__} has no loss_function property")
        return
    had = "_loss_function" in vars(model)
    previous = vars(model).get("_loss_function")

    def restore() -> None:
        if had:
            model._loss_function = previous
        else:
            vars(model).pop("_loss_function", None)

    try:
        model.loss_function = causal_lm_loss
    except AttributeError:  # a property without a setter
        model._loss_function = causal_lm_loss
    if model.loss_function is not causal_lm_loss:
        restore()
        report.skipped.append(f"loss: {type(model).__name__}.loss_function does not return an assigned loss")
        return
    report._undo.append(restore)
    report.swapped["loss"] = 1


def _patch_attention(model: nn.Module, report: PatchReport, unmarked: str | None) -> None:
    """Move a model on transformers' "sdpa" attention to `attention.IMPLEMENTATION` (the same
    attention; plain causal attention keeps SDPA's causal kernel under torch.compile)."""
    current = getattr(model.config, "_attn_implementation", None)
    if current == attention.IMPLEMENTATION:
        report.skipped.append(f"causal attention: the model is on {current!r} already (a config shared with a "
                              "patched model?)")
        return
    if current != attention.BASE or not hasattr(model, "set_attn_implementation"):
        report.skipped.append(f"causal attention: the model's attention is {current!r}, not {attention.BASE!r}")
        return
    why = attention.register()
    if why is not None:
        report.skipped.append(f"causal attention: {why}")
        return
    model.set_attn_implementation(attention.IMPLEMENTATION)
    if model.config._attn_implementation != attention.IMPLEMENTATION:
        report.skipped.append("causal attention: the model did not take a registered attention implementation")
        return

    def restore() -> None:
        if model.config._attn_implementation == attention.IMPLEMENTATION:  # not moved on since
            model.set_attn_implementation(current)

    report._undo.append(restore)
    report.swapped["causal attention"] = 1
    why, undo = attention.swap_mask(model.model) if unmarked is None else (unmarked, None)
    if undo is None:
        report.skipped.append(f"causal attention without a cache: {why}")
    else:
        report._undo.append(undo)


def _patch_rotary(model: nn.Module, report: PatchReport, unmarked: str | None) -> None:
    """Point the model's ``apply_rotary_pos_emb`` at cuteforge's kernel (`cuteforge.nn.rotary`),
    which acts in the decoder's marked calls."""
    why, undo = rotary.swap(model) if unmarked is None else (unmarked, None)
    if undo is None:
        report.skipped.append(f"rotary embedding: {why}")
        return
    report._undo.append(undo)
    report.swapped["rotary embedding"] = 1


def _patch_residual_norm(model: nn.Module, report: PatchReport) -> None:
    """Swap each decoder layer's forward for one whose post-attention norm does the residual
    add (`cuteforge.nn.residual_norm`); a layer it does not know is left, with the reason."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        report.skipped.append("residual norm: no decoder `model.layers`")
        return
    whys: dict[str, int] = {}
    for layer in layers:
        why, undo = residual_norm.swap(layer, RMSNorm)
        if undo is None:
            whys[str(why)] = whys.get(str(why), 0) + 1
        else:
            report._undo.append(undo)
            report.swapped["residual norm"] = report.swapped.get("residual norm", 0) + 1
    report.skipped += [f"residual norm ({n} layers): {why}" for why, n in whys.items()]


def _mark_decoder(model: nn.Module, report: PatchReport) -> str | None:
    """Mark the decoder's calls (`decoder_call`), which the swapped module functions of
    causal attention and the rotary embedding act in. None on success, else why not."""
    why, undo = decoder_call.mark(getattr(model, "model", None))
    if undo is not None:
        report._undo.append(undo)
    return why


def _takes_fused_loss(model: nn.Module) -> bool:
    """Whether ``model`` is a decoder `model` and a bias-free nn.Linear `lm_head`."""
    decoder, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    return isinstance(decoder, nn.Module) and type(head) is nn.Linear and head.bias is None


def _cache_name(cls: type) -> str:
    """What a forward or an output class calls the KV cache: "cache" from transformers 5.24
    on (which warns at the old name on every call, even for None), "past_key_values" before
    (asked when the model is patched, not while a compiled call is traced)."""
    if dataclasses.is_dataclass(cls):
        names: Any = {f.name for f in dataclasses.fields(cls)}
    else:
        names = inspect.signature(cls.forward).parameters  # (through transformers' wrappers)
    return "cache" if "cache" in names else "past_key_values"


def _cache_names(model: nn.Module) -> tuple[str, str, str]:
    """The names `_fused_loss_forward` passes and reads the cache under: the model's forward's,
    its decoder's, and the outputs' field."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return _cache_name(type(model)), _cache_name(type(model.model)), _cache_name(CausalLMOutputWithPast)


def _fused_loss_forward(self: nn.Module, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                        past_key_values: Any = None, inputs_embeds: Any = None, labels: Any = None,
                        use_cache: Any = None, logits_to_keep: Any = 0, **kwargs: Any) -> Any:
    """The patched model's forward: given labels, the loss from the decoder's last hidden
    states and the LM head's weight through `cuteforge.ops.linear_cross_entropy` (the logits
    are never materialized; the output's ``logits`` is None); the model's own forward
    otherwise (and in eager mode with ``compiled_only``). Bound to the model as a method
    (`types.MethodType`) with its settings on the model, so a deep copy of the patched
    model runs its own modules."""
    compiled_only, own, (cache_arg, decoder_cache_arg, cache_field) = getattr(self, _FUSED_ATTR)
    # the cache is passed on only when given (a caller's `cache=` reaches the model through **kwargs)
    given = past_key_values is not None
    cache = {cache_arg: past_key_values} if given else {}
    head = self.lm_head
    if labels is None or not head.weight.is_cuda or (compiled_only and not torch.compiler.is_compiling()):
        arguments = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                     "inputs_embeds": inputs_embeds, "labels": labels, "use_cache": use_cache,
                     "logits_to_keep": logits_to_keep, **cache, **kwargs}
        return own(**arguments) if own is not None else type(self).forward(self, **arguments)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from ..ops import linear_cross_entropy

    num_items = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    if given:  # a `cache=` given too wins, as transformers' rename has it
        kwargs.setdefault(decoder_cache_arg, past_key_values)
    out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden = out.last_hidden_state
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    loss = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight,
                                shift_labels.reshape(-1).to(hidden.device),
                                reduction="sum" if num_items is not None else "mean")
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    return CausalLMOutputWithPast(loss=loss, logits=None, **{cache_field: getattr(out, cache_field, None)},
                                  hidden_states=out.hidden_states, attentions=out.attentions)


def patch(model: nn.Module, *, norm: bool = True, mlp: bool | str = "activation", loss: bool = True,
          fused_loss: bool | str = "compiled", embedding: bool = True, causal_attention: bool = True,
          rotary_embedding: bool = True, residual_norm: bool = False) -> PatchReport:
    """Swap ``model``'s RMSNorms (``norm``), SwiGLU MLPs (``mlp``), causal-LM loss (``loss``)
    and token embeddings (``embedding``: `cuteforge.nn.Embedding`, whose gradient under
    torch.compile skips Inductor's fp32 copy of the table) in place.

    ``mlp``: "activation" (the default) keeps the projections on torch's ``nn.Linear`` and
    runs ``silu(gate) * up`` as one cuteforge kernel forward and one backward
    (`cuteforge.nn.SwiGLUMLP` with ``gemm=False``; under torch.compile, torch's expression,
    which Inductor fuses); True runs the GEMMs on cuteforge's kernels too (``gemm=True``);
    "recompute" is "activation" whose gate and up projections run, with grad too, as one
    gated GEMM that writes neither activation, the backward recomputing them (less memory,
    more time); False leaves the MLPs. Without grad every swapped MLP runs its gate and up
    as the gated GEMM where it applies (`cuteforge.nn.SwiGLUMLP`).

    ``rotary_embedding``: the model's ``apply_rotary_pos_emb`` runs as one cuteforge
    kernel over q and k, forward and backward, for as long as a model of its type is
    patched (`cuteforge.nn.rotary`: the swap is in transformers' modeling module, so
    other models of the type take it too; under torch.compile, torch's expression).

    ``fused_loss``: a call with labels computes the loss from the hidden states and the LM
    head without materializing the logits (`cuteforge.ops.linear_cross_entropy`; such calls
    return ``logits=None``): always (True), never (False), or under torch.compile only
    ("compiled", the default: eager, cuteforge's cross-entropy on bf16 logits was faster
    and no larger; compiled, the fused loss was both faster and smaller, docs/nn.md).

    ``causal_attention``: a model on transformers' "sdpa" attention keeps SDPA's causal
    kernel under torch.compile for plain causal attention (no padding mask, no cache
    offset), where transformers would build an explicit mask that SDPA runs several times
    slower (`cuteforge.nn.attention`); other calls get transformers' own mask, as do calls
    with ``use_cache=False`` that pass their own position ids (transformers cannot rule out
    packed sequences in them while tracing; positions the decoder makes are never packed).

    ``residual_norm``: each decoder layer's residual add before its post-attention norm
    runs in that norm, forward and backward (`cuteforge.nn.residual_norm`: one kernel
    fewer each way a layer); only for layers whose forward is the Llama family's as this
    version knows it, and whose norms were swapped. Off by default: in the model benchmark
    it is level with the default compiled and slower in host-bound eager steps (docs/nn.md).

    Returns the report (also kept on the model for `unpatch`). A model patched already is
    refused: unpatch it first."""
    if mlp not in (True, False, "activation", "recompute"):
        raise ValueError(f"cuteforge.patch: mlp must be True, False, 'activation' or 'recompute', got {mlp!r}")
    if fused_loss not in (True, False, "compiled"):
        raise ValueError(f"cuteforge.patch: fused_loss must be True, False or 'compiled', got {fused_loss!r}")
    kind = _model_type(model)
    if getattr(model, _REPORT_ATTR, None) is not None:
        raise ValueError("cuteforge.patch: this model is patched already; call cuteforge.unpatch(model) first")
    report = PatchReport(kind, _model=weakref.ref(model))
    act = getattr(model.config, "hidden_act", None)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            cls = type(child).__name__
            if norm and cls.endswith("RMSNorm") and not isinstance(child, RMSNorm):
                new = _rms_norm_of(child)
                if new is None:
                    report.skipped.append(f"{cls} {name}: no 1-D weight and float epsilon")
                else:
                    _swap(report, parent, name, child, new, "RMSNorm")
            elif embedding and type(child) is nn.Embedding:
                _swap(report, parent, name, child, _embedding_of(child), "Embedding")
            elif mlp and cls.endswith("MLP") and not isinstance(child, SwiGLUMLP):
                new_mlp = _mlp_of(child, act, gemm=mlp is True, recompute=mlp == "recompute")
                if new_mlp is None:
                    report.skipped.append(f"{cls} {name}: not a bias-free silu gate/up/down MLP of nn.Linear")
                else:
                    _swap(report, parent, name, child, new_mlp, "MLP")
    if loss:
        _patch_loss(model, report)
    if residual_norm:
        _patch_residual_norm(model, report)
    unmarked = _mark_decoder(model, report) if causal_attention or rotary_embedding else None
    if causal_attention:
        _patch_attention(model, report, unmarked)
    if rotary_embedding:
        _patch_rotary(model, report, unmarked)
    if fused_loss:
        if not _takes_fused_loss(model):
            report.skipped.append("fused loss: no decoder `model` and bias-free nn.Linear `lm_head`")
        else:
            had_own = "forward" in vars(model)
            own = vars(model).get("forward")  # someone else's (accelerate's hooks, say): kept behind ours
            setattr(model, _FUSED_ATTR, (fused_loss == "compiled", own, _cache_names(model)))
            model.forward = types.MethodType(_fused_loss_forward, model)

            def restore_forward() -> None:
                vars(model).pop(_FUSED_ATTR, None)
                if had_own:
                    model.forward = own
                else:
                    vars(model).pop("forward", None)

            report._undo.append(restore_forward)
            report.swapped["fused loss"] = 1
    setattr(model, _REPORT_ATTR, report)
    report._undo.insert(0, lambda: setattr(model, _REPORT_ATTR, None))
    return report


def unpatch(model: nn.Module) -> None:
    """Undo `patch` on ``model`` (nothing if it is not patched). A deep copy of a patched
    model runs patched, but its undo would act on the original: refused."""
    report = getattr(model, _REPORT_ATTR, None)
    if report is None:
        return
    if report._model() is not model:
        raise ValueError("cuteforge.unpatch: this model is a copy of a patched model, whose patch belongs to the "
                         "original (to hold an unpatched copy, copy the model before patching it)")
    report.undo()
