"""Session 29: forward configs side by side at a few shapes, both modes: the registered
softmax_fwd kernel on contiguous rows (the ops' same_heads kernels where the rows are
realigned), kernel alone, M = 2^28 // N, L2 flushed, % of the measured copy. The first
config of each case is what the ops run today (`spec.config_for` with the call's key).

    python benchmarks/probes/softmax_s29b.py --cases "float32:65537:regs/512/2,mbar/256/4" [--out F]

A case is dtype:N:configs, configs as path/threads/cluster; cases separated by ';'.
"""

from __future__ import annotations

import argparse

import torch
from probe_io import dump, time_forward

from cuteforge import timing
from cuteforge.arch import target_arch
from cuteforge.kernels.softmax import SoftmaxConfig
from cuteforge.kernels.softmax.spec import config_for, kernel_params, softmax_fwd

CASES = ("float32:50257:mbar/256/4,async/256/4;float32:65537:regs/512/2,mbar/256/4,mbar/256/8;"
         "float32:100001:mbar/256/8,mbar/256/16;float32:65536:mbar/256/4,mbar/256/8")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES)
    p.add_argument("--out")
    a = p.parse_args()
    copy = timing.copy_bandwidth()
    rows = []
    for case in a.cases.split(";"):
        dname, n, cfgs = case.split(":")
        n, dtype = int(n), getattr(torch, dname)
        m = (1 << 28) // n
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        key = softmax_fwd.signature.bind((x, y))
        for mode in ("softmax", "log_softmax"):
            configs = [config_for(target_arch(), n, x.element_size() * 8, False, m, mode, key)]
            for c in cfgs.split(","):
                path, t, cl = c.split("/")
                cfg = SoftmaxConfig(int(t), int(t), int(cl), path)
                if cfg not in configs:
                    configs.append(cfg)
            ref = getattr(torch, mode)(x.float(), -1)
            line = []
            for i, cfg in enumerate(configs):
                try:
                    fn = softmax_fwd.get(key, kernel_params(mode, key, True), cfg)
                except ValueError as e:
                    rows.append({"N": n, "dtype": dname, "mode": mode, "config": repr(cfg), "error": str(e)[:200]})
                    continue
                r = time_forward(fn, x, y, ref, copy)
                rows.append({"N": n, "M": m, "dtype": dname, "mode": mode, "config": repr(cfg), "default": i == 0, **r})
                line.append(f"{cfg.path}/{cfg.threads}/c{cfg.cluster_n}{'*' if i == 0 else ''} {r['pct_copy']:.1f}")
            print(f"{dname} n={n} {mode}: " + ", ".join(line), flush=True)
    dump(a.out, copy, rows)


if __name__ == "__main__":
    main()
