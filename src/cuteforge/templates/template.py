"""`cuteforge.Template`: a Jinja2 CuTe DSL source with autotunable parameters and fusion.

    add = Template("add", SOURCE, params={"THREADS_PER_BLOCK": 256, "VEC": 4})
    add.run([a, b], out)                                  # render, compile (cached), launch
    add.run([a, b], out, THREADS_PER_BLOCK=[128, 256, 512])   # a list: tune, then launch
    add.choices([a, b], out, THREADS_PER_BLOCK=[128, 256])    # one TemplateChoice per set
    add.tune([a, b], out, THREADS_PER_BLOCK=[...], reference=torch.add)
    add.run([a, b], out, epilogue=Epilogue.from_fn(lambda acc, r: relu(acc) + r, r="full"),
            epilogue_args={"r": r})

Tensors: every dim is dynamic. Dims of equal extent share a symbol (TVM-FFI then checks
they stay equal on each call); the pattern of equalities, not the extents, selects the
variant, so new sizes never recompile. Parameters are `int`, `float` or `bool`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..fusion import KINDS, Epilogue, Prologue
from ..kernel import CompileSpec
from ..signature import BoundKey
from .render import TemplateError, format_value
from .variant import Rendered, TemplateConfig, TemplateKernel, VariantDef, variant_kernel

TEMPLATES: dict[str, Template] = {}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass
class TemplateChoice:
    """One parameter set of a template for one call: rendered, or the error it raised."""

    template: str
    kernel: TemplateKernel
    key: BoundKey
    config: TemplateConfig
    rendered: Rendered | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def kernel_name(self) -> str | None:
        return self.rendered.kernel_name if self.rendered else None

    @property
    def source_path(self) -> str | None:
        return self.rendered.path if self.rendered else None

    @property
    def description(self) -> str:
        return f"cuteforge template {self.template} ({', '.join(f'{k}={v}' for k, v in self.config.params)})"

    def spec(self) -> CompileSpec:
        return self.kernel.spec(self.key, (), self.config)

    def compile(self) -> Any:
        """The compiled function (through the kernel cache); raises what the compile raised."""
        if self.error is not None:
            raise TemplateError(f"{self.description} failed to render: {self.error}")
        return self.kernel.compile(self.spec())


@dataclass
class BoundCall:
    kernel: TemplateKernel
    tensors: tuple[Any, ...]
    n_inputs: int


class Template:
    """See the module docstring. `name` must be unique (letters, digits, underscores)."""

    def __init__(
        self,
        name: str,
        source: str,
        *,
        params: Mapping[str, Any] | None = None,
        entry: str | None = None,
        archs: Sequence[str] = ("sm_80+",),
        epilogue_kinds: Sequence[str] = KINDS,
        prologue_kinds: Sequence[str] = KINDS,
        validate: Callable[[CompileSpec, TemplateConfig], None] | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"template name {name!r} must start with a letter and hold only letters, digits and underscores")
        if not isinstance(source, str):
            raise TypeError(f"template {name!r}: source must be a str (Jinja2 text), got {type(source).__name__}")
        if entry is not None and not entry.isidentifier():
            raise ValueError(f"template {name!r}: entry {entry!r} is not a Python identifier")
        old = TEMPLATES.get(name)
        if old is not None and (old.source != source or old.entry != entry):
            raise ValueError(f"a cuteforge template named {name!r} already exists (with a different source); template names must be unique")
        self.name = name
        self.source = source
        self.defaults = dict(params or {})
        for k, v in self.defaults.items():
            format_value(k, v)
        self.entry = entry
        self.archs = tuple(archs)
        self.epilogue_kinds = tuple(epilogue_kinds)
        self.prologue_kinds = tuple(prologue_kinds)
        self.validate = validate
        self._variants: dict[tuple[Any, ...], TemplateKernel] = {}
        TEMPLATES[name] = self

    def __repr__(self) -> str:
        return f"<cuteforge.Template {self.name} params={self.defaults}>"

    # binding a call ------------------------------------------------------------------
    def bind(
        self,
        inputs: Sequence[Any] | Mapping[str, Any],
        output: Any,
        epilogue: Epilogue | None = None,
        epilogue_args: Mapping[str, Any] | None = None,
        prologues: Mapping[str, Prologue] | None = None,
        prologue_args: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> BoundCall:
        """The variant kernel and the full tensor list (inputs, operands, output) of a call."""
        import torch

        if isinstance(inputs, Mapping):
            names, tensors = list(inputs), list(inputs.values())
        else:
            tensors = list(inputs)
            names = [f"in{i}" for i in range(len(tensors))]
        for n, t in zip([*names, "output"], [*tensors, output]):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"template {self.name!r}: {n} must be a torch.Tensor, got {type(t).__name__}")
        out_shape = tuple(output.shape)
        ep_key, ep_names, ep_tensors = None, [], []
        if epilogue is not None:
            if not isinstance(epilogue, Epilogue):
                raise TypeError(f"template {self.name!r}: epilogue must be a cuteforge.fusion.Epilogue, got {type(epilogue).__name__}")
            ep, ep_tensors = self._bind_operands("epilogue", epilogue, epilogue_args or {}, out_shape, self.epilogue_kinds)
            ep_key, ep_names = ep.key, [n for n, _ in ep.operands]
        elif epilogue_args:
            raise ValueError(f"template {self.name!r}: epilogue_args given without an epilogue")
        pro_defs: dict[str, list[Any]] = {}
        pro_tensors: list[Any] = []
        for inp, pro in (prologues or {}).items():
            if inp not in names:
                raise ValueError(f"template {self.name!r}: prologue for unknown input {inp!r}; inputs: {names}")
            if not isinstance(pro, Prologue):
                raise TypeError(f"template {self.name!r}: prologue for {inp!r} must be a cuteforge.fusion.Prologue, got {type(pro).__name__}")
            shape = tuple(tensors[names.index(inp)].shape)
            p, ts = self._bind_operands(f"prologue of {inp!r}", pro, (prologue_args or {}).get(inp, {}), shape, self.prologue_kinds)
            pro_defs[inp] = [p.key, [n for n, _ in p.operands]]
            pro_tensors += ts
        all_t = [*tensors, *ep_tensors, *pro_tensors, output]
        arg_names = [*names, *(f"epi_{n}" for n in ep_names), *(f"pro_{i}_{n}" for i, (_, ns) in pro_defs.items() for n in ns), "out"]
        dims = _dim_symbols(all_t)
        # The variant is a function of these (cheap) facts: skip building its definition
        # and hashing the template source on every call.
        memo = (tuple(arg_names), tuple(map(tuple, dims)), ep_key, tuple((i, p[0]) for i, p in pro_defs.items()))
        k = self._variants.get(memo)
        if k is None:
            d = VariantDef(self.name, self.source, self.entry, list(self.archs), arg_names, dims, len(tensors), ep_key, ep_names, pro_defs)
            k = variant_kernel(d)
            if self.validate is not None and self.validate not in k.validators:
                k.validators.append(self.validate)
            self._variants[memo] = k
        return BoundCall(k, tuple(all_t), len(tensors))

    def _bind_operands(self, role: str, fn: Any, args: Mapping[str, Any], shape: tuple[int, ...], allowed: tuple[str, ...]) -> tuple[Any, list[Any]]:
        import torch

        names = [n for n, _ in fn.operands]
        unknown = set(args) - set(names)
        if unknown:
            raise ValueError(f"template {self.name!r}: {role} has no operand(s) {sorted(unknown)}; operands: {names}")
        scalars, tensors = {}, []
        for n, kind in fn.operands:
            if kind not in allowed:
                raise ValueError(f"template {self.name!r} cannot fuse {kind} operands ({role} operand {n!r}); it supports {list(allowed)}")
            if n not in args:
                raise ValueError(f"template {self.name!r}: {role} operand {n!r} ({kind}) needs a value in the *_args mapping")
            v = args[n]
            if kind == "scalar":
                scalars[n] = v
                continue
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"template {self.name!r}: {role} operand {n!r} is a {kind} operand and needs a torch.Tensor, got {type(v).__name__}")
            want = {"row": (shape[0],), "col": (shape[-1],), "full": shape}[kind]
            if tuple(v.shape) != want:
                raise ValueError(f"template {self.name!r}: {role} operand {n!r} ({kind}) must have shape {want}, got {tuple(v.shape)}")
            tensors.append(v)
        return (fn.bind(**scalars) if scalars else fn), tensors

    # choices, tuning, running ----------------------------------------------------------
    def config(self, **params: Any) -> TemplateConfig:
        return TemplateConfig.of({**self.defaults, **params})

    def choices(self, inputs: Sequence[Any] | Mapping[str, Any], output: Any, *, epilogue: Epilogue | None = None,
                epilogue_args: Mapping[str, Any] | None = None, prologues: Mapping[str, Prologue] | None = None,
                prologue_args: Mapping[str, Mapping[str, Any]] | None = None, **param_grid: Any) -> list[TemplateChoice]:
        """One choice per parameter set of the grid (lists are swept, other values fixed).
        A set that fails to validate or render gives a choice with `.error`; the others
        are rendered and written to the source cache, ready to compile and time."""
        call = self.bind(inputs, output, epilogue, epilogue_args, prologues, prologue_args)
        return self._choices(call, param_grid)

    def _choices(self, call: BoundCall, param_grid: Mapping[str, Any]) -> list[TemplateChoice]:
        from ..autotune.candidates import validate_config

        k = call.kernel
        key = key_for(call, self.name)
        out = []
        for params in grid(param_grid):
            try:
                cfg = self.config(**params)
            except TypeError as e:
                raise TypeError(f"template {self.name!r}: {e}") from None
            choice = TemplateChoice(self.name, k, key, cfg)
            try:
                spec = choice.spec()
                validate_config(k, spec, cfg)
                choice.rendered = k.render(spec)
            except Exception as e:  # this parameter set only: the sweep goes on
                choice.error = f"{type(e).__name__}: {e}"
            out.append(choice)
        return out

    def tune(self, inputs: Sequence[Any] | Mapping[str, Any], output: Any, *, epilogue: Epilogue | None = None,
             epilogue_args: Mapping[str, Any] | None = None, prologues: Mapping[str, Prologue] | None = None,
             prologue_args: Mapping[str, Mapping[str, Any]] | None = None, reference: Callable[..., Any] | None = None,
             tune_options: Mapping[str, Any] | None = None, **param_grid: Any) -> Any:
        """Time every choice with cuteforge's autotuner (parallel compile, CUDA graphs,
        stored results). `reference(*inputs, *operand tensors)` returns the expected output;
        choices that fail to render, compile, launch or match score inf with their reason.
        Returns the autotuner's `TuneResult` (best_config is a TemplateConfig)."""

        call = self.bind(inputs, output, epilogue, epilogue_args, prologues, prologue_args)
        return self._tune(call, param_grid, reference, tune_options or {})

    def _tune(self, call: BoundCall, param_grid: Mapping[str, Any], reference: Callable[..., Any] | None, options: Mapping[str, Any]) -> Any:
        from ..autotune import tune as autotune

        chs = self._choices(call, param_grid)
        ok = [c.config for c in chs if c.ok]
        ref = None
        if reference is not None:
            def ref(*ts: Any) -> Any:
                return reference(*ts[:-1])
        opts = dict(options)
        opts.setdefault("key", chs[0].key)  # also for CPU tensors (compile-only problems)
        opts.setdefault("outputs", [call.kernel.signature.names[-1]])
        if not ok:
            raise TemplateError(f"template {self.name!r}: every choice failed to render: " + "; ".join(f"{c.config!r}: {c.error}" for c in chs[:3]))
        res = autotune(call.kernel, call.tensors, configs=ok, reference=ref, **opts)
        if res.best_config not in ok:  # CUTEFORGE_AUTOTUNE=off or every choice failed
            res.best_config = ok[0]
        for c in chs:
            if not c.ok:
                res.times_ms[c.config] = math.inf
                res.errors[c.config] = f"rejected before compiling: {c.error}"
        return res

    def run(self, inputs: Sequence[Any] | Mapping[str, Any], output: Any, *, epilogue: Epilogue | None = None,
            epilogue_args: Mapping[str, Any] | None = None, prologues: Mapping[str, Prologue] | None = None,
            prologue_args: Mapping[str, Mapping[str, Any]] | None = None, **params: Any) -> Any:
        """Render, compile (once, ever: cached) and launch on torch's current stream.
        A parameter given as a list is tuned first (the result is stored). Returns `output`."""
        call = self.bind(inputs, output, epilogue, epilogue_args, prologues, prologue_args)
        if output.numel() == 0:
            return output
        if any(isinstance(v, (list, tuple)) for v in params.values()):
            cfg = self._tune(call, params, None, {}).best_config
        else:
            cfg = self.config(**params)
        call.kernel(*call.tensors, config=cfg)
        return output

    def compile(self, inputs: Sequence[Any] | Mapping[str, Any], output: Any, **kw: Any) -> Any:
        """Compile (or load) without launching; the compiled function takes the call's tensors."""
        fusion = {k: kw.pop(k) for k in ("epilogue", "epilogue_args", "prologues", "prologue_args") if k in kw}
        call = self.bind(inputs, output, **fusion)
        return call.kernel.get(key_for(call, self.name), (), self.config(**kw))


def key_for(call: BoundCall, where: str) -> BoundKey:
    """The call's compile key. CUDA tensors go through `Signature.bind` (all checks);
    CPU or meta tensors describe a problem to compile for without a GPU."""
    ts = call.tensors
    if all(t.is_cuda for t in ts):
        return call.kernel.signature.bind(ts, f"template {where!r}")
    from ..signature import dtype_name, vector_width

    vec = []
    for t in ts:
        ptr = 0 if t.is_meta else t.data_ptr()
        vec.append(vector_width(ptr, t.stride()[:-1], t.element_size()))
        if t.dim() and t.stride()[-1] != 1 and t.shape[-1] > 1:
            raise ValueError(f"template {where!r}: tensors need contiguous rows (last-dim stride 1), got strides {tuple(t.stride())}")
    return BoundKey(tuple(dtype_name(t.dtype) for t in ts), (), tuple(vec))


def grid(param_grid: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Cartesian product of the list-valued entries (other values fixed), in given order."""
    keys = list(param_grid)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in param_grid.values()]
    for k, v in zip(keys, values):
        if not v:
            raise ValueError(f"parameter {k!r} has an empty list of values")
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)] if keys else [{}]


def _dim_symbols(tensors: Sequence[Any]) -> list[list[str]]:
    """Dims of equal extent share a symbol, numbered in order of first appearance."""
    sym: dict[int, str] = {}
    out = []
    for t in tensors:
        out.append([sym.setdefault(int(n), f"d{len(sym)}") for n in t.shape])
    return out
