"""`cuteforge tune` problem factories of the memory-bound families (no GPU): each problem
is keyed as its op keys a call on fresh contiguous tensors (so the stored winner is what
the op looks up), carries the op's compile parameters and rejects bad parameters by name.
The ops' lookups themselves run on the GPU (tests/gpu/test_tune_problems_gpu.py)."""

from __future__ import annotations

import pytest

from cuteforge.autotune.problems import rows_shape
from cuteforge.signature import BoundKey
from cuteforge.tune_cli import problem_factory

N = (("N", 1000),)


def test_every_family_registers_its_factories() -> None:
    for name in ("row_reduce", "softmax_fwd", "softmax_bwd", "norm_fwd", "cross_entropy_fwd", "cross_entropy_bwd"):
        assert callable(problem_factory(name))
    assert rows_shape("x", (3, 5)) == (3, 5)
    with pytest.raises(ValueError, match="softmax_fwd takes shapes MxN, got 2x3x4"):
        problem_factory("softmax_fwd")((2, 3, 4), "float32", {})


def test_the_autotuner_knows_no_kernel() -> None:
    """Families register their problems when imported; the autotuner and the templates
    import no kernel family (a fresh interpreter, so earlier imports do not count)."""
    import subprocess
    import sys

    code = ("import sys, cuteforge.autotune, cuteforge.templates.template, cuteforge.autotune.problems as p\n"
            "assert not [m for m in sys.modules if m.startswith('cuteforge.kernels')], 'kernels imported'\n"
            "assert not p.PROBLEMS\n"
            "import cuteforge.kernels.reduce\n"
            "assert set(p.PROBLEMS) == {'row_reduce'}, sorted(p.PROBLEMS)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    import ast
    from pathlib import Path

    import cuteforge

    root = Path(cuteforge.__file__).parent
    for path in [*root.glob("autotune/*.py"), *root.glob("templates/*.py")]:  # lazy imports too
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any("kernels" in n.split(".") for n in names), f"{path.name} imports {names}"


def test_norm_fwd_problem() -> None:
    f = problem_factory("norm_fwd")
    p = f((4096, 1000), "bfloat16", {"kind": "layer"})
    assert p.key == BoundKey(("bfloat16",) * 6 + ("float32",) * 2, N, (8,) * 6 + (4, 4))
    assert p.params == {"eps": 1e-5, "has_bias": True, "has_residual": False, "kind": "layer"}
    assert p.dims == {"M": 4096} and p.outputs == ("y",) and p.configs is None  # the kernel's own list
    rms = f((7, 1000), "float32", {"residual": "true", "eps": "1e-5"})
    assert rms.params == {"eps": 1e-5, "has_bias": False, "has_residual": True, "kind": "rms"}
    fp32w = f((7, 1000), "bfloat16", {"weight": "float32"})
    assert fp32w.key.dtypes[1:3] == ("float32", "float32") and fp32w.key.vec[1] == 4
    for params, msg in (({"kind": "batch"}, "kind must be rms or layer"), ({"bias": True}, "takes no bias"),
                        ({"residual": "maybe"}, "residual must be true or false"), ({"wieght": "x"}, "unknown parameter"),
                        ({"weight": "float16"}, "weight must be x or float32"),
                        ({"eps": "-1e-5"}, "eps must be a finite number >= 0"), ({"eps": "tiny"}, "eps must be"),
                        ({"eps": [1e-5]}, "eps must be")):
        with pytest.raises(ValueError, match=msg):
            f((8, 8), "float32", dict(params))


def test_softmax_problems_start_with_the_ops_heuristic() -> None:
    from cuteforge.kernels.softmax.spec import config_for

    fwd = problem_factory("softmax_fwd")((32768, 1000), "float16", {"mode": "log_softmax"})
    assert fwd.key == BoundKey(("float16",) * 2, N, (8, 8)) and fwd.params == {"mode": "log_softmax"}
    assert fwd.configs[0] == config_for("sm_90a", 1000, 16, False, 32768) and len(set(fwd.configs)) == len(fwd.configs)
    bwd = problem_factory("softmax_bwd")((16, 1000), "float32", {})
    assert bwd.key == BoundKey(("float32",) * 3, N, (4, 4, 4)) and bwd.params == {"mode": "softmax_bwd"}
    assert bwd.configs[0] == config_for("sm_90a", 1000, 32, True, 16) and bwd.outputs == ("dx",)
    # realigned rows (N * 2 bytes not a multiple of 16): the ops call with same_heads, so the
    # stored winner must be keyed with it
    from cuteforge.kernels.softmax.spec import kernel_params

    odd = problem_factory("softmax_fwd")((4096, 50257), "bfloat16", {})
    assert odd.params == dict(kernel_params("softmax", odd.key, True)) == {"mode": "softmax", "same_heads": True}
    odd_bwd = problem_factory("softmax_bwd")((4096, 50257), "bfloat16", {"mode": "log_softmax_bwd"})
    assert odd_bwd.params == {"mode": "log_softmax_bwd", "same_heads": True}
    with pytest.raises(ValueError, match="mode must be one of"):
        problem_factory("softmax_bwd")((8, 8), "float32", {"mode": "softmax"})
    with pytest.raises(ValueError, match="unknown parameter"):
        problem_factory("softmax_fwd")((8, 8), "float32", {"dim": 0})


def test_cross_entropy_and_row_reduce_problems() -> None:
    fwd = problem_factory("cross_entropy_fwd")((4096, 1000), "bfloat16", {})
    assert fwd.key == BoundKey(("bfloat16", "int64", "float32", "float32"), N, (8, 2, 4, 4))
    assert fwd.params == {"ignore_index": -100} and fwd.outputs == ("loss",)
    bwd = problem_factory("cross_entropy_bwd")((4096, 1000), "float32", {"ignore_index": -1})
    assert bwd.key == BoundKey(("float32", "int64", "float32", "float32", "float32"), N, (4, 2, 4, 4, 4))
    assert bwd.params == {"ignore_index": -1} and bwd.outputs == ("dlogits",)
    with pytest.raises(ValueError, match="unknown parameter"):
        problem_factory("cross_entropy_fwd")((8, 8), "float32", {"label_smoothing": 0.1})
    with pytest.raises(ValueError, match="ignore_index must be an integer"):
        problem_factory("cross_entropy_bwd")((8, 8), "float32", {"ignore_index": "none"})
    red = problem_factory("row_reduce")((4096, 1000), "bfloat16", {"op": "argmax"})
    assert red.key == BoundKey(("bfloat16", "int64"), N, (8, 2)) and red.params == {"op": "argmax"}
    with pytest.raises(ValueError, match="op must be one of"):
        problem_factory("row_reduce")((8, 8), "float32", {"op": "median"})


def test_ops_take_only_their_own_config_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops use what `lookup` returns (it has checked the config against the kernel's
    validate hook, tests/test_autotune.py) only when it is the family's config type;
    otherwise (nothing stored, or a foreign record) the heuristic decides."""
    import importlib

    import torch

    import cuteforge.autotune as autotune
    from cuteforge.kernels.cross_entropy.device import ce_config
    from cuteforge.kernels.norm import config as norm_config
    from cuteforge.kernels.reduce.row import RowReduceConfig

    norm_ops = importlib.import_module("cuteforge.ops.norm_launch")  # the ops' launchers pick the config
    ce_ops = importlib.import_module("cuteforge.ops.cross_entropy_launch")
    x = torch.empty(64, 1000, dtype=torch.bfloat16)
    stored: list = []
    monkeypatch.setattr(autotune, "lookup", lambda *a, **k: stored[0])
    good_norm = norm_config.candidate_configs(1000, 16, False, "layer")[2]
    good_ce = RowReduceConfig(256, 64, 2)
    for value, want in ((None, None), (good_norm, good_norm), (good_ce, None)):
        stored[:] = [value]
        assert norm_ops._tuned_fwd("key", (), x) == want
    for value, want in ((None, ce_config(1000, 16)), (good_ce, good_ce), (good_norm, ce_config(1000, 16))):
        stored[:] = [value]
        assert ce_ops._tuned(None, "key", -100, x) == want
