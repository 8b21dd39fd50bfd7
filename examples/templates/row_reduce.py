"""A row-reduction template with a fused epilogue: out[m] = epilogue(sum_n prologue(x[m, n])).

One CTA of THREADS_PER_BLOCK threads per row; each thread sums VEC-wide (16-byte)
vectors of the row in fp32, then the warps combine through shared memory and thread 0
applies the epilogue to the row's sum (per-row and scalar operands) and stores it.
`sum(x) * scale + bias` thus costs no pass over memory beyond the reduction's own.

    python examples/templates/row_reduce.py --compile-only --arch sm_90a   # no GPU needed
    python examples/templates/row_reduce.py                                # GPU: run and check
"""

from __future__ import annotations

import argparse
import os
import sys

SOURCE = r'''
{{gen_defines()}}
WARPS: cutlass.Constexpr = THREADS_PER_BLOCK // 32


@cute.kernel
def {{kernel_name}}_device(x: cute.Tensor{{fused_params}}, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    n = x.shape[1]
    rx = x[row, None]
    accf = cute.make_rmem_tensor((VEC,), Float32)
    accf.fill(0.0)
    nv = n // VEC
    for c in range(tidx, nv, THREADS_PER_BLOCK):
        v = cute.local_tile(rx, (VEC,), (c,)).load().to(Float32)
        accf.store(accf.load() + {{prologue("x", "v")}})
    s = Float32(0.0)
    for i in cutlass.range_constexpr(VEC):
        s = s + accf[i]
    # the tail (n % VEC elements): one element per thread, the prologue on a 1-vector
    j = nv * VEC + tidx
    if j < n:
        t1 = cute.make_rmem_tensor((1,), Float32)
        t1[0] = rx[j].to(Float32)
        tv = t1.load()
        t1.store({{prologue("x", "tv")}})
        s = s + t1[0]
    s = cute.arch.warp_reduction_sum(s)
    smem = cutlass.memory.SmemAllocator()
    partial = smem.allocate_tensor(Float32, cute.make_layout((WARPS,)), byte_alignment=16)
    if tidx % 32 == 0:
        partial[tidx // 32] = s
    cute.arch.sync_threads()
    if tidx == 0:
        total = Float32(0.0)
        for w in cutlass.range_constexpr(WARPS):
            total = total + partial[w]
        r1 = cute.make_rmem_tensor((1,), Float32)
        r1[0] = total
        acc = r1.load()
{% for op in epilogue_operands %}
        {{op.var}} = cute.full_like(acc, {{op.tensor}}[row].to(Float32))
{% endfor %}
        o1 = cute.make_rmem_tensor((1,), out.element_type)
        o1.store(({{epilogue("acc")}}).to(out.element_type))
        out[row] = o1[0]


{{def_kernel("x")}}
    {{kernel_name}}_device(x{{fused_args}}, out).launch(grid=(out.shape[0], 1, 1), block=(THREADS_PER_BLOCK, 1, 1), stream=stream)
'''


def _validate(spec, config) -> None:
    t, vec = config.get("THREADS_PER_BLOCK"), config.get("VEC")
    if t % 32 or not 32 <= t <= 1024:
        raise ValueError(f"THREADS_PER_BLOCK={t}: must be a multiple of 32 in [32, 1024]")
    if vec < 1 or vec & (vec - 1) or vec > 16:
        raise ValueError(f"VEC={vec}: must be a power of two <= 16")


_T = None


def template():
    global _T
    if _T is None:
        import cuteforge

        # Rows produce one value each: the epilogue takes scalars and per-row operands.
        _T = cuteforge.Template("row_sum", SOURCE, params={"THREADS_PER_BLOCK": 256, "VEC": 4}, validate=_validate,
                                epilogue_kinds=("scalar", "row"), prologue_kinds=("scalar",))
    return _T


def row_sum(x, *, epilogue=None, epilogue_args=None, prologue=None, prologue_args=None, out_dtype=None, **params):
    """epilogue(x.sum(-1)) for a 2-D x (rows contiguous), fused into one kernel."""
    import torch

    out = torch.empty(x.shape[0], dtype=out_dtype or x.dtype, device=x.device)
    params.setdefault("VEC", 16 // x.element_size())
    template().run({"x": x}, out, epilogue=epilogue, epilogue_args=epilogue_args,
                   prologues={"x": prologue} if prologue is not None else None,
                   prologue_args={"x": prologue_args} if prologue_args else None, **params)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile-only", action="store_true", help="compile for --arch without a GPU")
    p.add_argument("--arch", default=None, help="target, e.g. sm_90a (default: this GPU)")
    args = p.parse_args(argv)
    if args.arch:
        os.environ["CUTEFORGE_ARCH"] = args.arch
        os.environ["CUTE_DSL_ARCH"] = args.arch
    import torch

    from cuteforge.fusion import Epilogue, Prologue, abs

    ep = Epilogue.from_fn(lambda acc, scale, bias: acc * scale + bias, scale="scalar", bias="row")
    pro = Prologue.from_fn(lambda v: abs(v))
    if args.compile_only:
        for dt in (torch.float32, torch.bfloat16):
            x = torch.empty(7, 1000, dtype=dt)
            out = torch.empty(7, dtype=dt)
            template().compile({"x": x}, out, VEC=16 // x.element_size())
            template().compile({"x": x}, out, epilogue=ep, epilogue_args={"scale": 0.5, "bias": torch.empty(7, dtype=dt)},
                               prologues={"x": pro}, VEC=16 // x.element_size())
        print("compiled row_sum (plain and fused) for", os.environ.get("CUTEFORGE_ARCH", "the default target"))
        return 0
    torch.manual_seed(0)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for m, n in ((1, 1), (7, 7), (1000, 1000), (3, 65537), (65537, 5)):
            x = torch.randn(m, n, device="cuda", dtype=dt)
            bias = torch.randn(m, device="cuda", dtype=dt)
            tol = dict(rtol=1e-4, atol=1e-3) if dt == torch.float32 else dict(rtol=2e-2, atol=2e-2 * max(1.0, n ** 0.5 / 8))
            torch.testing.assert_close(row_sum(x).float(), x.float().sum(-1), **tol)
            got = row_sum(x, epilogue=ep, epilogue_args={"scale": 0.5, "bias": bias}, prologue=pro)
            want = x.float().abs().sum(-1) * 0.5 + bias.float()
            torch.testing.assert_close(got.float(), want, **tol)
    print("row_sum correct: plain and fused |x| -> sum * 0.5 + bias, fp32/bf16/fp16, odd shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
