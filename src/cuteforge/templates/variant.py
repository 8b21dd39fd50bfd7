"""A template variant: one cuteforge `Kernel` per (template, argument structure, fusion).

The variant's configs are parameter sets (`TemplateConfig`); its builder renders the
template for a compile spec (dtypes and alignment from the key, parameters from the
config), writes the source to the code cache, imports it and returns the entry point.
So every template choice compiles through `Kernel.compile` -> `KernelCache`: L1/L2
caching, arch checks, `CUTEFORGE_LOG` and the autotuner's worker pool all apply.

A variant is defined by JSON-able data written as a tiny generated module
(`<cache>/src/v<hash>.py`, importable as `cuteforge.templates.generated.v<hash>`), so
a compile worker process rebuilds the very same kernel by importing that module.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from .. import compiler
from ..cache import log_topics
from ..fusion import Epilogue, Prologue
from ..kernel import REGISTRY, CompileSpec, Kernel
from ..signature import _CUTLASS_NAMES, Signature, TensorArg
from . import codecache
from .render import (
    KERNEL_NAME_TOKEN,
    RenderContext,
    TemplateError,
    TensorNode,
    format_value,
    module_text,
    render_text,
)

log = logging.getLogger("cuteforge")
ALL_DTYPES = tuple(_CUTLASS_NAMES)


@dataclass(frozen=True)
class TemplateConfig:
    """One parameter set of a template (sorted (name, value) pairs): a variant's config."""

    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        items = tuple(sorted((str(k), v) for k, v in self.params))  # JSON gives lists back
        for k, v in items:
            format_value(k, v)  # int / float / bool only
        object.__setattr__(self, "params", items)

    @classmethod
    def of(cls, params: dict[str, Any]) -> TemplateConfig:
        return cls(tuple(params.items()))

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    def __repr__(self) -> str:
        return "TemplateConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.params) + ")"


@dataclass
class Rendered:
    """One rendered choice: its kernel name, module source text, digest and path."""

    kernel_name: str
    text: str
    digest: str
    path: str
    entry: str


@dataclass
class VariantDef:
    """What fixes a variant (JSON round-trips through the generated module)."""

    template: str
    source: str
    entry: str | None
    archs: list[str]
    names: list[str]  # every kernel argument, in order: inputs, fused operands, output
    dims: list[list[str]]  # symbol per dim, per argument
    n_inputs: int
    epilogue: str | None = None  # Epilogue.key (scalars already bound)
    epilogue_names: list[str] = field(default_factory=list)
    prologues: dict[str, list[Any]] = field(default_factory=dict)  # input -> [key, operand names]

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @property
    def kernel_name(self) -> str:
        return f"tpl_{self.template}_{self.digest[:8]}"


class TemplateKernel(Kernel):
    """The cuteforge Kernel of one template variant (see the module docstring)."""

    def __init__(self, d: VariantDef, module: str) -> None:
        self.definition = d
        self.template_name = d.template
        self.epilogue = Epilogue.from_key(d.epilogue, d.epilogue_names) if d.epilogue else None
        self.prologues = {inp: Prologue.from_key(k, names) for inp, (k, names) in d.prologues.items()}
        sig = Signature(*(TensorArg(n, tuple(dims), dtypes=ALL_DTYPES) for n, dims in zip(d.names, d.dims)))

        def build(spec: CompileSpec) -> Any:
            return self.entry_point(self.render(spec))

        build.__module__ = module  # compile workers import this module to get the kernel
        build.__qualname__ = build.__name__ = d.kernel_name
        super().__init__(build, name=d.kernel_name, signature=sig, archs=tuple(d.archs), default_config=lambda spec: TemplateConfig(),
                         validate=self._run_validators)
        self.source_path = None
        self._rendered: dict[tuple[Any, ...], Rendered] = {}
        self._fingerprint = hashlib.sha256(f"{d.digest}\0{_jinja_version()}".encode()).hexdigest()
        self.validators: list[Any] = []

    def source_fingerprint(self) -> str:
        # The template source, its fusion and argument structure: edit any and the cache
        # directory changes, exactly as a user kernel's source file hash does.
        return self._fingerprint

    def _run_validators(self, spec: CompileSpec, config: Any) -> None:
        for fn in self.validators:
            fn(spec, config)

    # rendering -----------------------------------------------------------------------
    def nodes(self, spec: CompileSpec) -> list[TensorNode]:
        return [
            TensorNode(n, spec.key.dtypes[i], len(self.definition.dims[i]), spec.key.vec[i], i)
            for i, n in enumerate(self.definition.names)
        ]

    def render(self, spec: CompileSpec) -> Rendered:
        """Render (once per key and config) and write the source cache file."""
        config = spec.config if spec.config is not None else TemplateConfig()
        memo = (spec.key, config)
        hit = self._rendered.get(memo)
        if hit is not None:
            return hit
        d = self.definition
        nodes = self.nodes(spec)
        n_in, n_ep = d.n_inputs, len(self.epilogue.tensor_operands) if self.epilogue else 0
        pro_nodes: dict[str, list[TensorNode]] = {}
        pos = n_in + n_ep
        for inp, pro in self.prologues.items():
            k = len(pro.tensor_operands)
            pro_nodes[inp] = nodes[pos : pos + k]
            pos += k
        ctx = RenderContext(d.template, d.entry, nodes[:n_in], nodes[-1], config.params, self.epilogue, nodes[n_in : n_in + n_ep], self.prologues, pro_nodes)
        body = render_text(d.source, ctx)
        text = module_text(d.template, body, config.params)
        kname = f"cuteforge_{d.template}_{codecache.digest(text)[:8]}"
        text = text.replace(KERNEL_NAME_TOKEN, kname)
        h, path = codecache.write(text)
        meta = {"template": d.template, "kernel_name": kname, "variant": self.name, "variant_module": self.builder.__module__,
                "key": {"dtypes": spec.key.dtypes, "static": spec.key.static, "vec": spec.key.vec}, "config": config.params}
        codecache.write_meta(path, meta)
        r = Rendered(kname, text, h, str(path), d.entry or kname)
        self._rendered[memo] = r
        self.source_path = r.path
        return r

    def entry_point(self, r: Rendered) -> Any:
        mod = codecache.load(r.digest)
        fn = getattr(mod, r.entry, None)
        if fn is None:
            names = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_") and getattr(v, "__module__", "") == mod.__name__)
            raise TemplateError(f"template {self.template_name!r}: no entry point {r.entry!r} in generated module {r.path}; available callables: {names}")
        return fn

    def compile(self, spec: CompileSpec) -> Any:
        """`Kernel.compile` with the generated file as the logged source."""
        r = self.render(spec)

        def build(keep_artifacts: bool) -> compiler.CompileResult:
            if "source" in log_topics():
                log.warning("cuteforge: %s (template %s) generated source %s:\n%s", r.kernel_name, self.template_name, r.path, r.text)
            return compiler.compile_jit(self.entry_point(r), self.signature.fake_args(spec.key), spec.arch, keep_artifacts)

        return self.cache.get(
            kernel=self.name, key_repr=spec.key_repr(), arch=spec.arch, compile_fn=build,
            extra_fingerprint=self.source_fingerprint(), source_path=r.path,
        )


def _jinja_version() -> str:
    import jinja2

    return jinja2.__version__


VARIANT_MODULE = '''# Generated by cuteforge: the kernel of template {template!r} for one argument structure.
# Compile workers import this module to rebuild the same kernel.
from cuteforge.templates.variant import register_variant

register_variant(__name__, {definition!r})
'''


def register_variant(module: str, definition: str) -> TemplateKernel:
    """Called by a generated variant module: create (once) and register its kernel."""
    d = VariantDef(**json.loads(definition))
    k = REGISTRY.get(d.kernel_name)
    if isinstance(k, TemplateKernel):
        return k
    k = TemplateKernel(d, module)
    REGISTRY[k.name] = k
    return k


def variant_kernel(d: VariantDef) -> TemplateKernel:
    """The kernel for `d`, writing and importing its generated module the first time."""
    k = REGISTRY.get(d.kernel_name)
    if isinstance(k, TemplateKernel):
        return k
    text = VARIANT_MODULE.format(template=d.template, definition=d.to_json())
    h, _ = codecache.write(text, prefix="v")
    codecache.load(h, prefix="v")
    k = REGISTRY[d.kernel_name]
    assert isinstance(k, TemplateKernel)
    return k
