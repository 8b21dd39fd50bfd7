"""Session 29: the 16-bit long-row forward at N that do not start on 16 bytes.

Three builds of the registered softmax_fwd kernel on contiguous rows (the ops' same_heads
kernels), compiled here without the disk cache so that a module switch can tell them apart:

- ``s28``: session 28's defaults: no launch bound (`chunked.FWD_MIN_CTAS = 0`; ptxas takes
  96-100 registers at 262143, 2 CTAs per SM) and the cluster counted from N (131073: c16);
- ``s29``: the launch bound (3 CTAs per SM: 80 registers) and the cluster counted from the
  row's whole vectors (131073: c8);
- ``mbar``: s29's config on the `mbar` path (rows held in registers, not staged).

Kernel alone, M = 2^28 // N, L2 flushed (cuteforge.timing), % of the measured copy.
Writes JSON with ``--out``.

    python benchmarks/probes/softmax_s29a.py [--ns N,N,...] [--dtypes bfloat16,float16] [--out F]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from probe_io import dump, time_forward

from cuteforge import compiler, timing
from cuteforge.kernels.softmax import chunked
from cuteforge.kernels.softmax import config as cfg_mod
from cuteforge.kernels.softmax.spec import kernel_params, softmax_fwd


def _old_cluster(n: int) -> int:
    """Session 28's `_v2_forward` cluster: elements per thread counted from N."""
    c = 1
    while c < cfg_mod._V2_CLUSTER_CAP and -(-n // (cfg_mod._V2_THREADS * c)) > cfg_mod._V2_ELEMS:
        c *= 2
    return 16 if -(-n // (cfg_mod._V2_THREADS * c)) > 64 else c


def _build(key, params, cfg, min_ctas: int):
    chunked.FWD_MIN_CTAS = min_ctas
    spec = softmax_fwd.spec(key, params, cfg)
    return compiler.compile_jit(softmax_fwd.builder(spec), softmax_fwd.signature.fake_args(key), spec.arch).function


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ns", default="131073,151937,200001,262143,262144")
    p.add_argument("--dtypes", default="bfloat16,float16")
    p.add_argument("--out")
    a = p.parse_args()
    copy = timing.copy_bandwidth()
    rows = []
    for dname in a.dtypes.split(","):
        dtype = getattr(torch, dname)
        for n in (int(v) for v in a.ns.split(",")):
            m = (1 << 28) // n
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            y = torch.empty_like(x)
            key = softmax_fwd.signature.bind((x, y))
            new = cfg_mod.default_config(n, x.element_size() * 8, False)
            variants = {
                "s28": (dataclasses.replace(new, cluster_n=_old_cluster(n)), 0),
                "s29": (new, 3),
                "mbar": (dataclasses.replace(new, path="mbar"), 3),
            }
            for mode in ("softmax", "log_softmax"):
                params = kernel_params(mode, key, True)
                ref = getattr(torch, mode)(x.float(), -1)
                line = []
                for name, (cfg, min_ctas) in variants.items():
                    r = time_forward(_build(key, params, cfg, min_ctas), x, y, ref, copy)
                    rows.append({"N": n, "M": m, "dtype": dname, "mode": mode, "variant": name, "config": repr(cfg),
                                 "min_ctas": min_ctas, **r})
                    line.append(f"{name} c{cfg.cluster_n} {r['pct_copy']:.1f} (err {r['max_err']:.2g})")
                print(f"{dname} n={n} {mode}: " + ", ".join(line), flush=True)
    chunked.FWD_MIN_CTAS = 3
    dump(a.out, copy, rows)


if __name__ == "__main__":
    main()
