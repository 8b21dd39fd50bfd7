"""Rendering a template: the Jinja2 environment and the hooks a template source can call.

Hooks (see docs/templates.md):
  {{kernel_name}}            cuteforge_<template>_<hash8>, the hash of the rendered source
  {{def_kernel("a", "b")}}   the `@cute.jit` entry: one argument per input (aliased to the
                             given names), fused operands, the output, the stream
  {{input_nodes}}            TensorNode per input: .name .dtype (cutlass type) .dtype_name
                             .rank .vec (elements the call's pointer/strides allow per access)
  {{output_node}}            TensorNode of the output (get_output() gives its name)
  {{gen_defines()}}          one `NAME: cutlass.Constexpr = value` per parameter
  {{epilogue("acc")}}        the fused epilogue over `acc` (or `acc` when there is none);
                             epilogue_operands: OperandNode per tensor operand (.tensor .var .kind)
  {{prologue("x", "v")}}     input x's fused prologue over `v` (or `v`);
                             prologue_operands("x"): its operands
  {{fused_params}} / {{fused_args}}  ", epi_bias: cute.Tensor, ..." / ", epi_bias, ...": the
                             fused operand tensors, to pass from the entry to a @cute.kernel
Every parameter is also a Jinja variable (`{{THREADS_PER_BLOCK}}`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ..fusion import SOURCE_IMPORT, Epilogue, Prologue

KERNEL_NAME_TOKEN = "__CUTEFORGE_KERNEL_NAME__"
HEADER_IMPORTS = (
    "import cutlass",
    "import cutlass.cute as cute",
    "import cuda.bindings.driver as cuda",
    "from cutlass import Float32, Int32, Int64",
    SOURCE_IMPORT,
)


class TemplateError(ValueError):
    """A template could not be rendered for one parameter set (or is used wrongly)."""


@dataclass(frozen=True)
class TensorNode:
    name: str
    dtype_name: str  # torch name: float32, bfloat16, ...
    rank: int
    vec: int  # elements per aligned vector access for this call's tensor
    index: int

    @property
    def dtype(self) -> str:
        from ..signature import _CUTLASS_NAMES, torch_dtype

        return f"cutlass.{_CUTLASS_NAMES[torch_dtype(self.dtype_name)]}"

    @property
    def bits(self) -> int:
        import torch

        from ..signature import torch_dtype

        return torch.empty((), dtype=torch_dtype(self.dtype_name)).element_size() * 8

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class OperandNode:
    """A fused operand as the template sees it: `tensor` is its tensor's name inside the
    entry point (after def_kernel), `var` the variable the template loads its fp32
    values into (what epilogue()/prologue() read), `kind` row/col/full, `node` its
    TensorNode (dtype, vec)."""

    name: str
    kind: str
    tensor: str
    var: str
    node: TensorNode

    @property
    def arg(self) -> str:
        return f"arg_{self.tensor}"

    def __str__(self) -> str:
        return self.tensor


def format_value(name: str, v: Any) -> str:
    """A parameter value as Python source: int, float (inf/nan too) or bool."""
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return f'float("{v!r}")'
        return repr(v)
    raise TypeError(f"template parameter {name}={v!r}: parameters must be int, float or bool, got {type(v).__name__}")


@functools.lru_cache(maxsize=256)
def _compiled_jinja(source: str) -> Any:
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False, trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source)


class RenderContext:
    """The hooks for one render; records what the template used, to check afterwards."""

    def __init__(
        self,
        template_name: str,
        entry: str | None,
        inputs: list[TensorNode],
        output: TensorNode,
        params: tuple[tuple[str, Any], ...],
        epilogue: Epilogue | None,
        epilogue_nodes: list[TensorNode],
        prologues: dict[str, Prologue],
        prologue_nodes: dict[str, list[TensorNode]],
    ) -> None:
        self.template_name = template_name
        self.entry = entry
        self.inputs = inputs
        self.output = output
        self.params = params
        self.epilogue_fn = epilogue
        self.prologues = prologues
        self.used: set[str] = set()
        ep_tensors = epilogue.tensor_operands if epilogue is not None else ()
        self.epilogue_operands = [
            OperandNode(n, k, f"epi_{n}", f"epi_{n}_v", node) for (n, k), node in zip(ep_tensors, epilogue_nodes)
        ]
        self.prologue_ops: dict[str, list[OperandNode]] = {}
        for inp, pro in prologues.items():
            self.prologue_ops[inp] = [
                OperandNode(n, k, f"pro_{inp}_{n}", f"pro_{inp}_{n}_v", node)
                for (n, k), node in zip(pro.tensor_operands, prologue_nodes.get(inp, []))
            ]

    # hooks -------------------------------------------------------------------------
    def def_kernel(self, *names: str, output: str | None = None) -> str:
        self.used.add("def_kernel")
        if len(names) != len(self.inputs):
            raise TemplateError(
                f"template {self.template_name!r}: def_kernel got {len(names)} name(s) {list(names)} for "
                f"{len(self.inputs)} input(s) ({', '.join(n.name for n in self.inputs)})"
            )
        out = output or self.output.name
        args: list[tuple[str, str]] = [(f"arg_{a}", a) for a in names]
        args += [(o.arg, o.tensor) for o in self.fused_operands()]
        args.append((f"arg_{out}", out))
        seen = [a for _, a in args]
        dup = {a for a in seen if seen.count(a) > 1}
        if dup:
            raise TemplateError(f"template {self.template_name!r}: def_kernel names collide: {sorted(dup)}")
        entry = self.entry or KERNEL_NAME_TOKEN
        sig = ", ".join(f"{a}: cute.Tensor" for a, _ in args)
        lines = ["@cute.jit", f"def {entry}({sig}, stream: cuda.CUstream):"]
        lines += [f"    {alias} = {a}" for a, alias in args]
        return "\n".join(lines)

    def fused_operands(self) -> list[OperandNode]:
        """Every fused operand tensor, in kernel-argument order."""
        out = list(self.epilogue_operands)
        for ops in self.prologue_ops.values():
            out += ops
        return out

    def gen_defines(self) -> str:
        self.used.add("gen_defines")
        return "\n".join(f"{k}: cutlass.Constexpr = {format_value(k, v)}" for k, v in self.params)

    def get_output(self) -> str:
        return self.output.name

    def epilogue(self, acc: str) -> str:
        self.used.add("epilogue")
        if self.epilogue_fn is None:
            return acc
        names, it = [], iter(self.epilogue_operands)
        for _, kind in self.epilogue_fn.operands:
            if kind == "scalar":
                raise TemplateError(f"template {self.template_name!r}: unbound scalar epilogue operand; pass its value")
            names.append(next(it).var)
        return f"({self.epilogue_fn.source(acc, names)})"

    def prologue(self, input_name: str, value: str) -> str:
        self.used.add(f"prologue:{input_name}")
        pro = self.prologues.get(input_name)
        if pro is None:
            return value
        return f"({pro.source(value, [o.var for o in self.prologue_ops[input_name]])})"

    def prologue_operands(self, input_name: str) -> list[OperandNode]:
        return self.prologue_ops.get(input_name, [])

    def env(self) -> dict[str, Any]:
        env: dict[str, Any] = dict(self.params)
        env.update(
            kernel_name=KERNEL_NAME_TOKEN,
            def_kernel=self.def_kernel,
            gen_defines=self.gen_defines,
            get_output=self.get_output,
            input_nodes=self.inputs,
            output_node=self.output,
            epilogue=self.epilogue,
            epilogue_operands=self.epilogue_operands,
            has_epilogue=self.epilogue_fn is not None,
            prologue=self.prologue,
            prologue_operands=self.prologue_operands,
            fused_operands=self.fused_operands(),
            # pass the fused operand tensors on from the entry point to a @cute.kernel:
            fused_params="".join(f", {o.tensor}: cute.Tensor" for o in self.fused_operands()),
            fused_args="".join(f", {o.tensor}" for o in self.fused_operands()),
        )
        return env


def render_text(source: str, ctx: RenderContext) -> str:
    """Render the template body (kernel name still a token) and check the hooks used."""
    import jinja2

    try:
        body = _compiled_jinja(source).render(**ctx.env())
    except TemplateError:
        raise
    except jinja2.TemplateError as e:
        raise TemplateError(f"template {ctx.template_name!r} failed to render: {type(e).__name__}: {e}") from e
    except Exception as e:  # an error raised from inside the template (hook or expression)
        raise TemplateError(f"template {ctx.template_name!r} failed to render: {type(e).__name__}: {e}") from e
    if "def_kernel" not in ctx.used:
        raise TemplateError(f"template {ctx.template_name!r} never calls {{{{def_kernel(...)}}}}: it has no entry point")
    if ctx.epilogue_fn is not None and "epilogue" not in ctx.used:
        raise TemplateError(f"template {ctx.template_name!r} has no {{{{epilogue(...)}}}} hook, so it cannot fuse an epilogue")
    for name in ctx.prologues:
        if f"prologue:{name}" not in ctx.used:
            raise TemplateError(f"template {ctx.template_name!r} has no {{{{prologue({name!r}, ...)}}}} hook, so it cannot fuse a prologue into input {name!r}")
    return body


def module_text(template_name: str, body: str, params: tuple[tuple[str, Any], ...]) -> str:
    header = [f"# Generated by cuteforge from template {template_name!r}: {KERNEL_NAME_TOKEN}"]
    header.append("# parameters: " + (", ".join(f"{k}={v!r}" for k, v in params) or "none"))
    return "\n".join([*header, *HEADER_IMPORTS, "", ""]) + body
