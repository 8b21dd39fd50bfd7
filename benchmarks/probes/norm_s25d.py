"""Session 25, CPU only: does ptxas issue all of a row's global loads before the row's math?

At fp32 32768 x 8192 the RMSNorm backward's default (512 threads, the row in registers)
read 98.3 % of copy with dweight partials and 87.3 % without (`h200-norm-s25c-fp32-8192-frozen.json`);
LayerNorm's read 98.2 % without them, and its held-weight variant (`early_weight`) 77.0.
In the SASS of the slow ones (the cubin the DSL builds for sm_90a) part of the row's
128-bit loads come after the first FP32 multiply of the row loop: ptxas issued them in a
second batch, after the first batch's data arrived, so fewer bytes are in flight per
thread. The fast ones issue every load first. This prints, per (kind, dtype, N) and for
the kernel with and without partials, the default config (or the one given), the
registers the SASS names, and `late / all`: the 64- and 128-bit global loads of the row loop that come
after its first FP32 / packed-half multiply, out of all of them. Configs with `prefetch`
issue the next row's loads after the math on purpose: their count means nothing.

    python benchmarks/probes/norm_s25d.py rms float32 8192 ["NormConfig(512, 512, 1, 1)"]
"""

from __future__ import annotations

import re
import sys

sys.path.insert(0, "tests")  # run from the repository root
from ptxas_check import loop_loads  # noqa: E402

from cuteforge import compiler
from cuteforge.kernels.norm.config import NormConfig, default_bwd_config
from cuteforge.kernels.norm.spec import norm_bwd
from cuteforge.signature import BoundKey


def report(kind: str, dtype: str, n: int, cfg: NormConfig | None = None) -> list[dict]:
    bits = 32 if dtype == "float32" else 16
    v = 16 // (bits // 8)
    key = BoundKey((dtype,) * 4 + ("float32",) * 2 + (dtype,) + ("float32",) * 2, (("N", n),), (v,) * 4 + (4, 4, v, 4, 4))
    out = []
    for has_dw in (True, False):
        params = {"kind": kind, "has_bias": kind == "layer", "has_dsum": False} | ({} if has_dw else {"has_dw": False})
        spec = norm_bwd.spec(key, tuple(sorted(params.items())), cfg or default_bwd_config(n, bits, has_dw), arch="sm_90a")
        res = compiler.compile_jit(norm_bwd.builder(spec), norm_bwd.signature.fake_args(key), "sm_90a", keep_artifacts=True)
        sass = compiler.sass(res.cubin)
        used = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1) + 1  # highest register named
        out.append({"kind": kind, "dtype": dtype, "N": n, "partials": has_dw, "config": repr(spec.config),
                    "registers_seen": used, "late_all": loop_loads(sass)})
    return out


if __name__ == "__main__":
    kind, dtype, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = eval(sys.argv[4], {"NormConfig": NormConfig}) if len(sys.argv) > 4 else None  # noqa: S307 - CLI input
    for row in report(kind, dtype, n, cfg):
        print(row)
