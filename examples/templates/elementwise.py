"""An elementwise template: out = epilogue(prologue_a(a) + prologue_b(b)) over 2-D tensors.

THREADS_PER_BLOCK and VEC are template parameters (autotunable). Each thread owns VEC
consecutive elements of a row: one 16-byte access per operand when the row is long
enough, element by element (predicated) at the row's tail, so any N works.

    python examples/templates/elementwise.py --compile-only --arch sm_90a   # no GPU needed
    python examples/templates/elementwise.py                                # GPU: run, check, tune
"""

from __future__ import annotations

import argparse
import os
import sys

SOURCE = r'''
{{gen_defines()}}


@cute.kernel
def {{kernel_name}}_device(a: cute.Tensor, b: cute.Tensor{{fused_params}}, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, bidx, _ = cute.arch.block_idx()
    n = out.shape[1]
    chunk = bidx * THREADS_PER_BLOCK + tidx
    base = chunk * VEC
    ra = a[row, None]
    rb = b[row, None]
    ro = out[row, None]
    fa = cute.make_rmem_tensor((VEC,), Float32)
    fb = cute.make_rmem_tensor((VEC,), Float32)
{% for op in fused_operands if op.kind != "row" %}
    f_{{op.var}} = cute.make_rmem_tensor((VEC,), Float32)
{% endfor %}
    full = base + VEC <= n
    if full:
        # whole vector in range: one 16-byte access per tensor
        fa.store(cute.local_tile(ra, (VEC,), (chunk,)).load().to(Float32))
        fb.store(cute.local_tile(rb, (VEC,), (chunk,)).load().to(Float32))
{% for op in fused_operands if op.kind != "row" %}
        f_{{op.var}}.store(cute.local_tile({{op.tensor}}{{ "[row, None]" if op.kind == "full" else "" }}, (VEC,), (chunk,)).load().to(Float32))
{% endfor %}
    else:
        fa.fill(0.0)
        fb.fill(0.0)
{% for op in fused_operands if op.kind != "row" %}
        f_{{op.var}}.fill(0.0)
{% endfor %}
        for v in cutlass.range_constexpr(VEC):
            if base + v < n:
                fa[v] = ra[base + v].to(Float32)
                fb[v] = rb[base + v].to(Float32)
{% for op in fused_operands if op.kind != "row" %}
                f_{{op.var}}[v] = {{op.tensor}}[{{ "row, " if op.kind == "full" else "" }}base + v].to(Float32)
{% endfor %}
    xa = fa.load()
    xb = fb.load()
{% for op in fused_operands %}
{% if op.kind == "row" %}
    {{op.var}} = cute.full_like(xa, {{op.tensor}}[row].to(Float32))
{% else %}
    {{op.var}} = f_{{op.var}}.load()
{% endif %}
{% endfor %}
    acc = {{prologue("a", "xa")}} + {{prologue("b", "xb")}}
    res = {{epilogue("acc")}}
    if full:
        cute.local_tile(ro, (VEC,), (chunk,)).store(res.to(out.element_type))
    else:
        fo = cute.make_rmem_tensor((VEC,), out.element_type)
        fo.store(res.to(out.element_type))
        for v in cutlass.range_constexpr(VEC):
            if base + v < n:
                ro[base + v] = fo[v]


{{def_kernel("a", "b")}}
    m, n = out.shape
    {{kernel_name}}_device(a, b{{fused_args}}, out).launch(
        grid=(m, cute.ceil_div(n, THREADS_PER_BLOCK * VEC), 1), block=(THREADS_PER_BLOCK, 1, 1), stream=stream
    )
'''


def _validate(spec, config) -> None:
    """Rejected before anything compiles. (A VEC wider than the call's alignment is fine:
    the compile key carries the alignment, and the loads narrow to what it proves.)"""
    t, vec = config.get("THREADS_PER_BLOCK"), config.get("VEC")
    if t % 32 or not 32 <= t <= 1024:
        raise ValueError(f"THREADS_PER_BLOCK={t}: must be a multiple of 32 in [32, 1024]")
    if vec < 1 or vec & (vec - 1) or vec > 16:
        raise ValueError(f"VEC={vec}: must be a power of two <= 16")


def make_template():
    import cuteforge

    return cuteforge.Template("elementwise_add", SOURCE, params={"THREADS_PER_BLOCK": 256, "VEC": 4}, validate=_validate)


ADD = None


def template():
    global ADD
    if ADD is None:
        ADD = make_template()
    return ADD


def add(a, b, *, out=None, epilogue=None, epilogue_args=None, prologues=None, prologue_args=None, **params):
    """a + b (with optional fusion) through the template; 1-D inputs are treated as one row."""
    import torch

    shape = a.shape
    a2, b2 = (a.reshape(1, -1), b.reshape(1, -1)) if a.dim() == 1 else (a, b)
    out = torch.empty_like(a2) if out is None else out.reshape(a2.shape)
    template().run({"a": a2, "b": b2}, out, epilogue=epilogue, epilogue_args=epilogue_args, prologues=prologues, prologue_args=prologue_args, **params)
    return out.reshape(shape)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile-only", action="store_true", help="compile for --arch without a GPU")
    p.add_argument("--arch", default=None, help="target, e.g. sm_90a (default: this GPU)")
    args = p.parse_args(argv)
    if args.arch:
        os.environ["CUTEFORGE_ARCH"] = args.arch
        os.environ["CUTE_DSL_ARCH"] = args.arch
    import torch

    from cuteforge.fusion import Epilogue, Prologue, relu

    ep = Epilogue.from_fn(lambda acc, bias, s: relu(acc + bias) * s, bias="col", s="scalar")
    pro = Prologue.from_fn(lambda x: x * 2.0)
    if args.compile_only:
        dev = "cpu"
        for dt in (torch.float32, torch.bfloat16):
            a = torch.empty(7, 1000, dtype=dt, device=dev)
            for tpb in (128, 256, 512):
                template().compile({"a": a, "b": a.clone()}, torch.empty_like(a), THREADS_PER_BLOCK=tpb, VEC=16 // a.element_size())
            template().compile({"a": a, "b": a.clone()}, torch.empty_like(a), epilogue=ep,
                               epilogue_args={"bias": torch.empty(1000, dtype=dt), "s": 0.5}, prologues={"a": pro})
        # 2048 threads per block is past the hardware's 1024 on purpose: the template's
        # validate hook rejects that candidate before anything compiles, and says why.
        chs = template().choices({"a": a, "b": a.clone()}, torch.empty_like(a), THREADS_PER_BLOCK=[128, 256, 512, 2048])
        for c in chs:
            if c.error:
                print(f"{c.description}: rejected as intended: {c.error}")
            else:
                print(f"{c.description}: {c.kernel_name} {c.source_path}")
        print("compiled elementwise_add for", os.environ.get("CUTEFORGE_ARCH", "the default target"))
        return 0
    torch.manual_seed(0)
    worst = 0.0
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for shape in ((1,), (7,), (1000,), (65537,), (33, 1000)):
            a, b = torch.randn(shape, device="cuda", dtype=dt), torch.randn(shape, device="cuda", dtype=dt)
            got = add(a, b)
            torch.testing.assert_close(got, a + b)
            bias = torch.randn(shape[-1], device="cuda", dtype=dt)
            got = add(a, b, epilogue=ep, epilogue_args={"bias": bias, "s": 0.5}, prologues={"a": pro})
            want = (torch.relu((a.float() * 2.0 + b.float()) + bias.float()) * 0.5).to(dt)
            tol = 1e-5 if dt == torch.float32 else 1e-2
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
            worst = max(worst, (got.float() - want.float()).abs().max().item())
    a = torch.randn(4096, 4096, device="cuda")
    res = template().tune({"a": a, "b": a.clone()}, torch.empty_like(a), THREADS_PER_BLOCK=[128, 256, 512], VEC=4, reference=lambda x, y: x + y)
    print("elementwise_add correct (fp32/bf16/fp16, sizes 1, 7, 1000, 65537, 33x1000); max |err| fused", worst)
    print("tuned 4096x4096 fp32:", res.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
