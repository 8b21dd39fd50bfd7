"""Session 25: the frozen-weight backward (has_dw=False) at 16-bit N = 262144 read 82.0 %
(RMSNorm) / 76.4 % (LayerNorm) of copy through autograd on the H200, where the same
config with partials reads 93.7 / 88.8 % as a kernel (`h200-norm-bwd-longrow-frozen.json`).
This prints every cluster-staged backward shape that validates at 16-bit N (default
262144): threads 256 / 512 / 1024, clusters of 8 / 16, 1-4 stages, parts 0 / 2 / 4 / 8,
1-2 CTAs per SM, as a `--configs` list for bench_norm_staged.py, which times each with
and without partials (`--frozen`):

    python benchmarks/bench_norm_staged.py --ops rms_norm_bwd,layer_norm_bwd --dtypes bfloat16 \\
        --ns 262144 --frozen --no-quack --configs "$(python benchmarks/probes/norm_s25b.py)" --out OUT.json

`--retime` prints the few shapes worth a second look, for three more runs of the same
command with `--defaults-only` (the default and those).
"""

from __future__ import annotations

import sys
from dataclasses import replace

from cuteforge.kernels.norm.config import default_bwd_config


def shapes(n: int, bits: int = 16) -> list[str]:
    base = default_bwd_config(n, bits, True)
    out = []
    for c in (8, 16):
        for t in (256, 512, 1024):
            for s in (1, 2, 3, 4):
                for p in (0, 2, 4, 8):
                    for occ in (1, 2):
                        cfg = replace(base, threads=t, threads_per_row=t, cluster_n=c, stages=s, parts=p, ctas_per_sm=occ)
                        try:
                            cfg.validate(n, bits, backward=True)
                        except ValueError:
                            continue
                        if cfg != base:
                            out.append(repr(cfg))
    return out


# (threads, stages, parts, CTAs per SM) on the default's 16-CTA cluster: the shapes of the
# first sweep (`h200-norm-s25b-frozen-262144.json`) that read >= 88 % frozen for one of the
# two norms, timed again three times (`--retime`)
RETIME = [(256, 1, 0, 2), (256, 2, 4, 1), (256, 3, 4, 1), (512, 4, 2, 1), (256, 3, 2, 1), (512, 2, 2, 1),
          (256, 3, 0, 1)]


def retime(n: int = 262144, bits: int = 16) -> list[str]:
    base = default_bwd_config(n, bits, True)
    return [repr(replace(base, threads=t, threads_per_row=t, stages=s, parts=p, ctas_per_sm=o)) for t, s, p, o in RETIME]


if __name__ == "__main__":
    if sys.argv[1:] == ["--retime"]:
        print(";".join(retime()))
    else:
        print(";".join(shapes(int(sys.argv[1]) if len(sys.argv) > 1 else 262144)))
