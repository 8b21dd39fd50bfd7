"""Staged in session 24, run in session 25 (level; not adopted, gemm.md): a 16-bit column
bias read in 32-bit pairs.

Needs `gemm_s25a.patch` applied (`git apply benchmarks/probes/gemm_s25a.patch`). With it, a
16-bit column operand whose elements pairs start 4-byte aligned (the key's vec >= 2) is
loaded one 32-bit word per pair of adjacent columns a thread holds (the wgmma layout gives
each thread column pairs): on the fused default's 128x256 tile, 32 loads a thread per tile
instead of 64, and 32 registers held across the mainloop instead of 64 (early_operands).
`from_raw` takes each value's half where it is used. CPU (SASS of the 8192^3 fused
default): 32 predicated `LDG.E` before the mainloop, the halves taken (SHF / LOP3) after it,
no spill. CUTEFORGE_PROBE_PAIRS=0 turns it off
(the key does not change, so each side has its own cache).

On the H100 a column bias cost 2-3 % of the fused tile against the same tile plain
(gemm.md v4.8, `h100-gemm-epi-parts.json`), more than the activation; session 24 found the
activation's math was not what held the fused kernel back (`act_overlap`, level).

This driver runs four processes, pairs on / off / on / off, each in its own cache, and
each times cuBLAS, cuBLAS addmm + eager gelu, and on the fused default's config: plain,
bias, bias + gelu, bias + silu (`bench_gemm.measure`). Each side also writes bias + gelu
of a ragged problem (2049 x 4103 x 1000, N odd: the last column alone) so the driver can
check the two sides bitwise. Run from the repository root:

    python benchmarks/probes/gemm_s25a.py OUT.json
"""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 28672), (2048, 14336, 4096)]


def side(out_path: str, check_path: str) -> None:
    sys.path.insert(0, "benchmarks")
    import bench_gemm as bg
    import torch
    import torch.nn.functional as F

    from cuteforge.kernels.gemm.sm90.config import default_config
    from cuteforge.ops import gemm

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(2049, 1000, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(1000, 4103, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(4103, device="cuda", dtype=torch.bfloat16, generator=g)
    check = {"gelu": gemm(a, b, bias=bias, epilogue="gelu", config=default_config(8192, 8192, 8192, sms, fused=True)),
             "own": gemm(a, b, bias=bias, epilogue="gelu"),
             "fp16": gemm(a.half(), b.half(), bias=bias.half(), epilogue="silu")}
    torch.save({k: v.cpu() for k, v in check.items()}, check_path)
    rows = []
    for m, n, k in SHAPES:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cfg = default_config(m, n, k, sms, fused=True)
        fns = {
            "cublas": lambda: a @ b,
            "cublas_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
            "plain": lambda: gemm(a, b, config=cfg),
            "bias": lambda: gemm(a, b, bias=bias, config=cfg),
            "bias_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=cfg),
            "bias_silu": lambda: gemm(a, b, bias=bias, epilogue="silu", config=cfg),
        }
        row = {"M": m, "N": n, "K": k, "config": repr(cfg),
               "bias_gelu_rel_err": bg._err(fns["bias_gelu"](), fns["cublas_gelu"]())}
        ms = bg.measure(fns)
        row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
        row["bias_gelu_vs_cublas_gelu"] = round(ms["cublas_gelu"] / ms["bias_gelu"], 4)
        rows.append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "config"}), flush=True)
    with open(out_path, "w") as f:
        json.dump({"pairs": os.environ.get("CUTEFORGE_PROBE_PAIRS", "1"), "rows": rows}, f)


def main() -> None:
    if sys.argv[1] == "--side":
        side(sys.argv[2], sys.argv[3])
        return
    import torch

    out = {"command": "python benchmarks/probes/gemm_s25a.py OUT.json (with gemm_s25a.patch applied)",
           "gpu": torch.cuda.get_device_name(), "runs": []}
    tmp = tempfile.mkdtemp()
    checks = {}
    for i, pairs in enumerate(("1", "0", "1", "0")):
        env = dict(os.environ, CUTEFORGE_PROBE_PAIRS=pairs, CUTEFORGE_CACHE_DIR=os.path.join(tmp, f"cache-{pairs}"))
        res, chk = os.path.join(tmp, f"run{i}.json"), os.path.join(tmp, f"check-{pairs}.pt")
        subprocess.run([sys.executable, __file__, "--side", res, chk], env=env, check=True)
        with open(res) as f:
            out["runs"].append(json.load(f))
        checks[pairs] = chk
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
    on, off = torch.load(checks["1"]), torch.load(checks["0"])
    out["same_bits"] = {k: bool(torch.equal(on[k], off[k])) for k in on}
    print("same bits on/off:", out["same_bits"], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
