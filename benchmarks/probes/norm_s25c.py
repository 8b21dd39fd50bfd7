"""Session 25: the frozen-weight RMSNorm backward at fp32 32768 x 8192 read 86.8 % of copy
through autograd on the H200, quack's 98.8 % (`h200-s25-bwd-bars.json`); the shape keeps
the persistent register default (one 512-thread CTA per SM). This prints, as `--configs`
for bench_norm_staged.py (which adds the default, the register tuner candidates with
`--register`, and the row-staged ones, and times each with and without partials with
`--frozen`), the shapes those lists lack that validate at fp32 N (default 8192): the
register kernel of 256 / 512 threads at 2-4 CTAs per SM, alone or on 2-CTA clusters (the
kernel without partials needs fewer registers), and the cluster-staged backward (mbarrier
exchange) on clusters of 2 / 4 at 128 / 256 threads, 2 / 3 stages, 1-3 CTAs per SM:

    python benchmarks/bench_norm_staged.py --ops rms_norm_bwd,layer_norm_bwd --dtypes float32 --ns 8192 \\
        --frozen --register --no-quack --configs "$(python benchmarks/probes/norm_s25c.py)" --out OUT.json
"""

from __future__ import annotations

import sys

from cuteforge.kernels.norm.config import NormConfig


def shapes(n: int, bits: int = 32) -> list[str]:
    trial = [NormConfig(t, t, c, occ) for c in (1, 2) for t in (256, 512) for occ in (2, 3, 4)]
    trial += [NormConfig(t, t, c, occ, exchange="mbar", stages=s)
              for c in (2, 4) for t in (128, 256) for s in (2, 3) for occ in (1, 2, 3)]
    out = []
    for cfg in trial:
        try:
            cfg.validate(n, bits, backward=True)
        except ValueError:
            continue
        out.append(repr(cfg))
    return out


if __name__ == "__main__":
    print(";".join(shapes(int(sys.argv[1]) if len(sys.argv) > 1 else 8192)))
