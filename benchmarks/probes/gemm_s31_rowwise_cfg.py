"""Session 31: the config for fp8 GEMMs whose epilogue operands are the rowwise scales
(scale_a (M, 1), scale_b (1, N)), without and with an activation. The fused default holds
the operands from the mainloop beside 64-wide subtiles; the per-column fp32 scale is 64
registers a thread on a 128x256 tile. Times the fused default against the operands loaded
in the epilogue on 64- and 32-wide subtiles, raster n and m, with torch._scaled_mm rowwise
(use_fast_accum, + eager gelu) beside; balanced rounds (bench_gemm.measure), two passes.

    python benchmarks/probes/gemm_s31_rowwise_cfg.py [--shapes 8192x8192x8192,...] [--out F]
    python benchmarks/probes/gemm_s31_rowwise_cfg.py --epilogues "" --single   # one scale rowwise
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_gemm import measure, tflops  # noqa: E402

from cuteforge.kernels.gemm.sm90.config import default_config  # noqa: E402
from cuteforge.ops.gemm import gemm  # noqa: E402


def shape_rows(m: int, n: int, k: int, sms: int, epilogues: list[str], single: bool = False) -> list[dict]:
    fp8 = torch.float8_e4m3fn
    x, wt = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    sa = (x.abs().amax(1, keepdim=True) / 448).float()
    sw = (wt.abs().amax(1, keepdim=True) / 448).float()
    a, b, sb = (x / sa).to(fp8), (wt / sw).to(fp8).t(), sw.t()
    base = default_config(m, n, k, sms, 1, fused=True, vector_operands=2)
    cfgs = {"64n_early": base, "64n_late": replace(base, early_operands=False),
            "32n_late": replace(base, epi_n=32, early_operands=False),
            "32m_late": replace(base, epi_n=32, raster="m", early_operands=False)}
    ref = x.double() @ wt.double().t()
    rows = []
    for epi in epilogues:
        fns = {name: (lambda c=c, e=epi: gemm(a, b, scale_a=sa, scale_b=sb, epilogue=e, out_dtype=torch.bfloat16, config=c))
               for name, c in cfgs.items()}
        act = (lambda t: F.gelu(t, approximate="tanh")) if epi == "gelu" else (lambda t: t)
        fns["scaled_mm_fast"] = lambda act=act: act(torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True))
        r = act(ref)
        row: dict = {"M": m, "N": n, "K": k, "epilogue": epi, "configs": {n_: repr(c) for n_, c in cfgs.items()}}
        for name, fn in fns.items():
            row[f"{name}_rel_err"] = float((fn().double() - r).norm() / r.norm())
        for rep in range(2):
            ms = measure(fns)
            row[f"TFLOPs_{rep}"] = {name: tflops(m, n, k, t) for name, t in ms.items()}
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "configs"}), flush=True)
        rows.append(row)
    if single:
        # one rowwise scale, the other per tensor (no torch counterpart: _scaled_mm's rowwise
        # mode takes both)
        ta, tb = sa.max().reshape(()), sw.max().reshape(())
        a1, b1 = (x / ta).to(fp8), (wt / tb).to(fp8).t()
        ops = {"row_only": (a, sa, b1, tb), "col_only": (a1, ta, b, sb)}
        for form, (a_, sa_, b_, sb_) in ops.items():
            fns = {name: (lambda c=cfgs[name], a_=a_, sa_=sa_, b_=b_, sb_=sb_:
                          gemm(a_, b_, scale_a=sa_, scale_b=sb_, out_dtype=torch.bfloat16, config=c))
                   for name in ("64n_early", "32n_late")}
            r = (a_.double() * sa_) @ (b_.double() * sb_)
            row = {"M": m, "N": n, "K": k, "epilogue": "none", "scaling": form}
            for name, fn in fns.items():
                row[f"{name}_rel_err"] = float((fn().double() - r).norm() / r.norm())
            for rep in range(2):
                ms = measure(fns)
                row[f"TFLOPs_{rep}"] = {name: tflops(m, n, k, t) for name, t in ms.items()}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096,2048x8192x28672")
    p.add_argument("--out")
    p.add_argument("--single", action="store_true", help="also one rowwise scale with the other per tensor")
    p.add_argument("--epilogues", default="none,gelu")
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [r for s in args.shapes.split(",")
            for r in shape_rows(*(int(v) for v in s.split("x")), sms, [e for e in args.epilogues.split(",") if e], args.single)]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["python benchmarks/probes/gemm_s31_rowwise_cfg.py"] + sys.argv[1:]),
                       "gpu": torch.cuda.get_device_name(0),
                       "timing": "bench_gemm.measure (cuteforge.timing.bench, L2 flushed, balanced rounds), two passes",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
