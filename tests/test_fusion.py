"""Fusion on CPU: expression capture by tracing, canonical keys, binding, source text,
the torch reference, errors naming the operation, and TensorSSA code compiled for sm_90a."""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cuda.bindings.driver import CUstream

from cuteforge.fusion import (
    SOURCE_IMPORT,
    Epilogue,
    Prologue,
    UnsupportedFusionError,
    abs,
    clamp,
    exp,
    expr,
    gelu,
    log,
    maximum,
    minimum,
    neg,
    relu,
    rsqrt,
    sigmoid,
    silu,
    sqrt,
    tanh,
    where,
)


def test_capture_key_and_operands():
    ep = Epilogue.from_fn(lambda acc, bias, res: relu(acc + bias) + res, bias="col", res="full")
    assert ep.key == "epilogue:(add (relu (add $0 $1)) $2)|col,full"
    assert ep.operands == (("bias", "col"), ("res", "full"))
    assert ep.tensor_operands == ep.operands
    # names do not enter the key; the structure and kinds do
    same = Epilogue.from_fn(lambda a, b, c: relu(a + b) + c, b="col", c="full")
    assert same.key == ep.key and same == ep and hash(same) == hash(ep)
    assert Epilogue.from_fn(lambda a, b, c: relu(a + b) + c, b="row", c="full").key != ep.key
    assert Prologue.from_fn(lambda x: x * 2.0).key == "prologue:(mul $0 2.0)|"


def test_every_operation_is_captured():
    def fn(x, y):
        return (relu(x) + gelu(x) + gelu(x, approximate="tanh") + silu(x) + sigmoid(x) + tanh(x) + exp(x) + abs(x) + neg(x)
                + sqrt(x) + rsqrt(x) + log(x) + where(x > y, x, 0.5) + minimum(x, y) + maximum(1.0, y) - x / y * -x + x ** 2
                + x ** 0.5 + clamp(x, -1.0, 1.0) + where(x <= 1.0, 1.0, y) + where(x >= y, x, y) + where(x < 0, y, x)
                + where(x == y, 0.0, 1.0) + where(x != 2.0, x, y) + (2.0 - x) + (3.0 / y) + abs(x) + (+x))

    ep = Epilogue.from_fn(fn, y="full")
    ops = set(re_ops(ep.key))
    assert ops >= {"relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "abs", "neg", "sqrt", "rsqrt", "log", "where",
                   "minimum", "maximum", "add", "sub", "mul", "div", "gt", "le", "ge", "lt", "eq", "ne"}
    assert Epilogue.from_key(ep.key).key == ep.key


def re_ops(key: str) -> list[str]:
    import re

    return re.findall(r"\((\w+)", key)


def test_from_key_round_trip_and_parse_errors():
    ep = Epilogue.from_fn(lambda a, s: where(a > 0, a * s, a * float("inf")) + float("nan") * 0 + 1e-5, s="scalar")
    back = Epilogue.from_key(ep.key, ["s"])
    assert back.key == ep.key and back.operands == (("s", "scalar"),)
    with pytest.raises(ValueError, match="not a prologue key"):
        Prologue.from_key(ep.key)
    with pytest.raises(ValueError, match="unknown operation 'pow'"):
        expr.parse_key("(pow $0 2.0)")
    with pytest.raises(ValueError, match="trailing text"):
        expr.parse_key("$0 $1")


def test_bind_folds_scalars_into_the_key():
    ep = Epilogue.from_fn(lambda acc, s, b, t: acc * s + b * t, s="scalar", b="row", t="scalar")
    bound = ep.bind(s=0.5, t=2)
    assert bound.operands == (("b", "row"),)
    assert bound.key == "epilogue:(add (mul $0 0.5) (mul $1 2.0))|row"
    assert ep.bind(s=0.5, t=3).key != bound.key
    with pytest.raises(ValueError, match="no operand 'q'"):
        ep.bind(q=1.0)
    with pytest.raises(ValueError, match="'b' is a row operand, not a scalar"):
        ep.bind(b=1.0)
    with pytest.raises(TypeError, match="must be a Python number"):
        ep.bind(s=torch.tensor(1.0))


def test_source_text():
    ep = Epilogue.from_fn(lambda acc, bias, res: relu(acc + bias) * 2.0 + res, bias="col", res="full")
    assert ep.source("acc", ["b_v", "r_v"]) == "((cf_ops.relu((acc + b_v)) * 2.0) + r_v)"
    assert SOURCE_IMPORT == "from cuteforge.fusion import cute_ops as cf_ops"
    inf = Epilogue.from_fn(lambda a: minimum(a, float("inf")))
    assert inf.source("a") == 'cf_ops.minimum(a, float("inf"))'
    const = Epilogue.from_fn(lambda a: 3.0)
    assert const.source("a") == "cute.full_like(a, 3.0, cutlass.Float32)"
    with pytest.raises(TypeError, match="needs 2 operand name"):
        ep.source("acc", ["only_one"])


def test_reference_is_the_unfused_torch_expression():
    g = torch.Generator().manual_seed(0)
    acc, b, r = (torch.randn(5, 9, generator=g) for _ in range(3))
    ep = Epilogue.from_fn(lambda a, b, r: silu(a + b) * sigmoid(r) + gelu(r) - minimum(a, 0.0) + where(a > r, exp(-abs(a)), tanh(r)),
                          b="full", r="full")
    F = torch.nn.functional
    want = F.silu(acc + b) * torch.sigmoid(r) + F.gelu(r) - torch.clamp(acc, max=0.0) + torch.where(acc > r, torch.exp(-acc.abs()), torch.tanh(r))
    torch.testing.assert_close(ep.reference(acc, b, r), want)


def test_numbers_evaluate_on_the_host():
    assert relu(-2.0) == 0.0 and relu(3.0) == 3.0 and math.isnan(relu(float("nan")))
    assert maximum(1.0, 2.0) == 2.0 and minimum(1.0, 2.0) == 1.0
    assert gelu(0.0) == 0.0 and abs(-2.0) == 2.0 and neg(2.0) == -2.0
    assert math.isclose(sigmoid(0.0), 0.5) and math.isclose(silu(1.0), 1.0 / (1.0 + math.exp(-1.0)))


@pytest.mark.parametrize(
    "fn,what",
    [
        (lambda a: a if a > 0 else 0.0, "Python control flow"),
        (lambda a: a > 0 and a < 1, "Python control flow"),
        (lambda a: math.exp(a), "float()"),
        (lambda a: torch.relu(a), "torch function torch.relu"),
        (lambda a: a // 2, "floor division"),
        (lambda a: a % 2, "modulo"),
        (lambda a: a @ a, "matrix multiplication"),
        (lambda a: a[0], "indexing"),
        (lambda a: a.sum(), "method or attribute .sum"),
        (lambda a: a ** 1.7, "the power x \\*\\* 1.7"),
        (lambda a: 2.0 ** a, "the power 2.0 \\*\\* x"),
        (lambda a: (a > 0) + 1.0, "add on a comparison result"),
        (lambda a: a > 0, "returning a comparison result"),
        (lambda a: (a, a), "returning several values"),
        (lambda a: where(a, a, 0.0), "needs a comparison as its condition"),
        (lambda a: where(True, a, 0.0), "needs a traced comparison"),
        (lambda a: a + "x", "add with an operand of type str"),
        (lambda a: relu([a]), "works on traced values and numbers"),
        (lambda a: a & a, "bitwise and"),
        (lambda a: ~a, "bitwise not"),
        (lambda a: int(a), "int\\(\\)"),
        (lambda a: len(a), "len\\(\\)"),
    ],
)
def test_unsupported_operations_name_the_operation(fn, what):
    with pytest.raises(UnsupportedFusionError, match=what):
        Epilogue.from_fn(fn)


def test_signature_errors():
    with pytest.raises(ValueError, match=r"operand\(s\) \['bias'\] need a kind"):
        Epilogue.from_fn(lambda acc, bias: acc + bias)
    with pytest.raises(ValueError, match="kind 'colum' is not one of"):
        Epilogue.from_fn(lambda acc, bias: acc + bias, bias="colum")
    with pytest.raises(ValueError, match="not operands of the function"):
        Epilogue.from_fn(lambda acc: acc, bias="row")
    with pytest.raises(TypeError, match="plain positional names"):
        Epilogue.from_fn(lambda acc, *rest: acc)
    with pytest.raises(TypeError, match="accumulator as its first argument"):
        Epilogue.from_fn(lambda: 1.0)
    with pytest.raises(TypeError, match="needs a Python function"):
        Epilogue.from_fn(42)
    with pytest.raises(ValueError, match="approximate must be"):
        Epilogue.from_fn(lambda a: gelu(a, approximate="erf"))


def test_apply_and_source_compile_to_tensorssa_for_sm90a():
    """Both paths (apply while tracing, and the rendered text) in one kernel, sm_90a."""
    from cuteforge import compiler

    ep = Epilogue.from_fn(lambda acc, b, s: where(acc > b, gelu(acc) * s, silu(b)) + maximum(acc, 0.0) - exp(neg(abs(b))) + tanh(acc) / (sigmoid(b) + 1.0),
                          b="full", s="scalar").bind(s=0.5)
    text = ep.source("acc", ["bv"])

    @cute.kernel
    def body(x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        tx = cute.local_tile(x, (4,), (tidx,))
        ty = cute.local_tile(y, (4,), (tidx,))
        acc = tx.load().to(cutlass.Float32)
        bv = acc * 0.5
        r = ep.apply(acc, bv)
        ty.store(r.to(y.element_type))

    @cute.jit
    def run(x: cute.Tensor, y: cute.Tensor, stream: CUstream):
        body(x, y).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    m = cute.sym_int()
    fakes = [cute.runtime.make_fake_tensor(cutlass.BFloat16, (m,), (1,), assumed_align=16) for _ in range(2)]
    res = compiler.compile_jit(run, fakes, "sm_90a", keep_artifacts=True)
    assert res.ptx and ".target sm_90a" in res.ptx
    assert text.count("cf_ops.") >= 8
