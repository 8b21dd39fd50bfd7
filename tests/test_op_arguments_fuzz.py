"""The public ops' argument checks on the CPU, across ops and argument kinds (beyond
test_op_checks.py's one case per check): a bad argument is a TypeError or ValueError that
names the op and the argument, on CPU and "meta" tensors alike; a call that is otherwise
right ends with the error saying CUDA is needed, also for layouts (views, strides, empty
extents, 2**32-element meta tensors) the kernels take. No GPU and no compile."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import cuteforge.ops as ops

X = torch.randn(4, 8)
W = torch.randn(8)
T = torch.zeros(4, dtype=torch.int64)
A = torch.randn(4, 16).bfloat16()
B = torch.randn(16, 8).bfloat16()
F8 = torch.float8_e4m3fn
A8 = torch.randn(4, 16).to(F8)
B8 = torch.randn(8, 16).to(F8).t()  # column-major (K, N), as the fp8 GEMM takes
XL, WL = torch.randn(4, 16), torch.randn(10, 16)
META = torch.empty(4, 8, device="meta")
NOT_TENSORS = [None, 1, 1.0, "x", [[1.0] * 8] * 4, np.ones((4, 8), np.float32)]
BAD_DTYPES = [torch.int32, torch.int64, torch.float64, torch.complex64, torch.bool, F8, torch.uint8]

REDUCTIONS = ["sum", "mean", "amax", "amin", "argmax"]
ROW_OPS = {  # name -> call(x): one tensor argument 'x' of a float dtype
    **{op: getattr(ops, op) for op in REDUCTIONS},
    "softmax": lambda x: ops.softmax(x),
    "log_softmax": lambda x: ops.log_softmax(x),
    "rms_norm": lambda x: ops.rms_norm(x, _weight_for(x)),
    "layer_norm": lambda x: ops.layer_norm(x, _weight_for(x)),
}


def _weight_for(x: object) -> torch.Tensor:
    """A weight that fits x (the checks must be about x alone)."""
    if not isinstance(x, torch.Tensor) or x.is_nested:
        return W
    return torch.ones(x.shape[-1] if x.dim() else 1, device=x.device)


def _raises(error: type[Exception], *parts: str):
    """pytest.raises matching every part of the message literally."""
    return pytest.raises(error, match="".join(f"(?=.*{re.escape(p)})" for p in parts))


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("value", NOT_TENSORS, ids=lambda v: type(v).__name__)
def test_x_not_a_tensor(op: str, value: object) -> None:
    with _raises(TypeError, f"cuteforge.ops.{op}", "argument 'x' must be a torch.Tensor"):
        ROW_OPS[op](value)


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_x_dtype(op: str, dtype: torch.dtype, device: str) -> None:
    with _raises(TypeError, f"cuteforge.ops.{op}", "argument 'x' has dtype"):
        ROW_OPS[op](X.to(dtype).to(device))


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_x_0d(op: str) -> None:
    with _raises(ValueError, f"cuteforge.ops.{op}", "argument 'x'", "dim"):
        ROW_OPS[op](torch.tensor(1.0))


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("x", [
    X, X.t(), torch.zeros(4, 1).expand(4, 8), torch.randn(4, 16)[:, :8], torch.randn(2, 4, 8), torch.empty(0, 8),
    X.clone().requires_grad_(), META, torch.empty(2**16, 2**16, device="meta"),
], ids=["plain", "transposed", "expanded", "row-strided", "3d", "no-rows", "grad", "meta", "meta-2**32"])
def test_valid_layouts_end_at_the_device(op: str, x: torch.Tensor) -> None:
    with _raises(ValueError, f"cuteforge.ops.{op}", "argument 'x' must be a CUDA tensor", f"on {x.device.type}"):
        ROW_OPS[op](x)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("dim", [None, 1.5, "0", [0], True, torch.tensor(1), (0, 1)], ids=repr)
def test_reduction_dim_type(op: str, dim: object) -> None:
    with _raises(TypeError, f"cuteforge.ops.{op}", "argument 'dim' must be an int"):
        getattr(ops, op)(X, dim)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("dim", [2, -3])
def test_reduction_dim_range(op: str, dim: int) -> None:
    with _raises(ValueError, f"cuteforge.ops.{op}", f"argument 'dim'={dim} is out of range"):
        getattr(ops, op)(X, dim)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("keepdim", [1, None, "True", torch.tensor(True)], ids=repr)
def test_reduction_keepdim_type(op: str, keepdim: object) -> None:
    with _raises(TypeError, f"cuteforge.ops.{op}", "argument 'keepdim' must be a bool"):
        getattr(ops, op)(X, -1, keepdim)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize(("x", "dim"), [(torch.empty(4, 0), -1), (torch.empty(0, 8), 0)])
def test_reduction_empty_reduced_dim(op: str, x: torch.Tensor, dim: int) -> None:
    with _raises(ValueError, f"cuteforge.ops.{op}", "argument 'x' has size 0 in the reduced dim"):
        getattr(ops, op)(x, dim)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [None, 1.5, "0", [0], True, torch.tensor(0), (0, 1)], ids=repr)
def test_softmax_dim_type(op: str, dim: object) -> None:
    with _raises(TypeError, f"cuteforge.ops.{op}", "argument 'dim' must be an int"):
        getattr(ops, op)(X, dim)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_rows_too_long(op: str) -> None:
    with _raises(ValueError, f"cuteforge.ops.{op}", "argument 'x' has a last dim of 262145"):
        getattr(ops, op)(torch.empty(2, 262145, device="meta"))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_other_dim_and_numpy_dim_end_at_the_device(op: str) -> None:
    for dim in (0, np.int64(-1)):
        with _raises(ValueError, f"cuteforge.ops.{op}", "must be a CUDA tensor"):
            getattr(ops, op)(X, dim)


NORMS = {
    "rms_norm": lambda x, w, **kw: ops.rms_norm(x, w, **kw),
    "layer_norm": lambda x, w, **kw: ops.layer_norm(x, w, **kw),
}


@pytest.mark.parametrize("op", list(NORMS))
@pytest.mark.parametrize(("kwargs", "error", "parts"), [
    ({"weight": None}, TypeError, ("argument 'weight' must be a torch.Tensor",)),
    ({"weight": [1.0] * 8}, TypeError, ("argument 'weight' must be a torch.Tensor",)),
    ({"weight": W.int()}, TypeError, ("argument 'weight' has dtype int32",)),
    ({"weight": W.double()}, TypeError, ("argument 'weight' has dtype float64",)),
    ({"weight": torch.randn(1, 8)}, ValueError, ("argument 'weight' must have shape (8,)",)),
    ({"weight": torch.tensor(1.0)}, ValueError, ("argument 'weight' must have shape (8,)",)),
    ({"weight": W.to("meta")}, ValueError, ("argument 'weight' is on meta but 'x' is on cpu",)),
    ({"residual": "r"}, TypeError, ("argument 'residual' must be a torch.Tensor",)),
    ({"residual": X.half()}, TypeError, ("argument 'residual' has dtype float16 but 'x' has float32",)),
    ({"residual": torch.randn(1, 8)}, ValueError, ("argument 'residual' has shape (1, 8) but 'x' has (4, 8)",)),
    ({"residual": X.to("meta")}, ValueError, ("argument 'residual' is on meta but 'x' is on cpu",)),
    ({"eps": float("inf")}, ValueError, ("argument 'eps' must be finite and >= 0",)),
    ({"eps": np.float64("nan")}, ValueError, ("argument 'eps' must be finite and >= 0",)),
    ({"eps": "1e-5"}, TypeError, ("argument 'eps' must be a float, got str",)),
    ({"eps": None}, TypeError, ("argument 'eps' must be a float, got NoneType",)),
    ({"eps": True}, TypeError, ("argument 'eps' must be a float, got bool",)),
    ({"eps": torch.tensor(1e-5)}, TypeError, ("argument 'eps' must be a float, got Tensor",)),
    ({"eps": 1e-5j}, TypeError, ("argument 'eps' must be a float, got complex",)),
], ids=lambda v: repr(v)[:40])
def test_norm_arguments(op: str, kwargs: dict, error: type[Exception], parts: tuple[str, ...]) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by both ops' cases
    weight = kwargs.pop("weight", W)
    with _raises(error, f"cuteforge.ops.{op}", *parts):
        NORMS[op](X, weight, **kwargs)


@pytest.mark.parametrize("op", list(NORMS))
@pytest.mark.parametrize(("x", "weight", "kwargs"), [
    (X.bfloat16(), W, {}),                          # an fp32 weight beside bf16 x
    (X, torch.randn(16)[::2], {}),                  # a strided weight
    (X, torch.ones(1).expand(8), {}),               # a stride-0 weight
    (X, W, {"residual": X}),                        # the residual is x itself
    (X, W, {"eps": 0.0}), (X, W, {"eps": -0.0}), (X, W, {"eps": 1}), (X, W, {"eps": np.float32(1e-6)}),
    (X, W.clone().requires_grad_(), {}),
    (META, W.to("meta"), {}),
], ids=lambda v: repr(v)[:30])
def test_norm_valid_calls_end_at_the_device(op: str, x: torch.Tensor, weight: torch.Tensor, kwargs: dict) -> None:
    with _raises(ValueError, f"cuteforge.ops.{op}", "argument 'x' must be a CUDA tensor"):
        NORMS[op](x, weight, **kwargs)


@pytest.mark.parametrize(("bias", "error", "part"), [
    (torch.randn(7), ValueError, "argument 'bias' must have shape (8,)"),
    (W.int(), TypeError, "argument 'bias' has dtype int32"),
    (W.to("meta"), ValueError, "argument 'bias' is on meta"),
    (1e-5, TypeError, "argument 'bias' must be a torch.Tensor, got float"),  # eps passed in bias's place
])
def test_layer_norm_bias(bias: object, error: type[Exception], part: str) -> None:
    with _raises(error, "cuteforge.ops.layer_norm", part):
        ops.layer_norm(X, W, bias)


def test_layer_norm_bias_dtype_follows_weight() -> None:
    with _raises(TypeError, "argument 'bias' has dtype float32 but 'weight' has bfloat16"):
        ops.layer_norm(X.bfloat16(), W.bfloat16(), W)


CE = "cuteforge.ops.cross_entropy"


@pytest.mark.parametrize(("logits", "target", "kwargs", "error", "part"), [
    (None, T, {}, TypeError, "argument 'logits' must be a torch.Tensor"),
    (X, [0, 0, 0, 0], {}, TypeError, "argument 'target' must be a torch.Tensor"),
    (X.double(), T, {}, TypeError, "argument 'logits' has dtype float64"),
    (X, T.float(), {}, TypeError, "argument 'target' must be int64 class indices"),
    (W, T, {}, ValueError, "argument 'logits' must be 2-D"),
    (X.view(2, 2, 8), T, {}, ValueError, "argument 'logits' must be 2-D"),
    (X, T.view(4, 1), {}, ValueError, "argument 'target' must have shape (4,)"),
    (X, torch.tensor(0), {}, ValueError, "argument 'target' must have shape (4,)"),
    (X, T.to("meta"), {}, ValueError, "argument 'target' is on meta but 'logits' is on cpu"),
    (torch.empty(4, 0), T, {}, ValueError, "argument 'logits' must have 1 to 2147483647 classes"),
    (X.t().contiguous().t(), T, {}, ValueError, "argument 'logits' must have contiguous rows"),
    (X, T, {"reduction": "MEAN"}, ValueError, "argument 'reduction' must be one of"),
    (X, T, {"reduction": None}, ValueError, "argument 'reduction' must be one of"),
    (X, T, {"ignore_index": 1.5}, TypeError, "argument 'ignore_index' must be an int"),
    (X, T, {"ignore_index": True}, TypeError, "argument 'ignore_index' must be an int"),
    (X, T, {"ignore_index": torch.tensor(-100)}, TypeError, "argument 'ignore_index' must be an int"),
    (X, T, {"ignore_index": np.float64(-100)}, TypeError, "argument 'ignore_index' must be an int"),
    (X, T, {"ignore_index": 2**63}, ValueError, "does not fit in int64"),
], ids=lambda v: repr(v)[:30])
def test_cross_entropy_arguments(logits: object, target: object, kwargs: dict, error: type[Exception], part: str) -> None:
    with _raises(error, CE, part):
        ops.cross_entropy(logits, target, **kwargs)


@pytest.mark.parametrize(("logits", "target", "kwargs"), [
    (X, T, {"reduction": "none"}), (X, T, {"reduction": "sum"}), (X, T, {"reduction": np.str_("mean")}),
    (torch.randn(4, 16)[:, :8], T, {}),                                   # a row stride
    (X, torch.zeros(1, dtype=torch.int64).expand(4), {}),                # a stride-0 target
    (torch.empty(0, 8), T[:0], {}), (torch.empty(0, 8), T[:0], {"reduction": "none"}),
    (X.clone().requires_grad_(), T, {}),
    (META, T.to("meta"), {}),
], ids=lambda v: repr(v)[:30])
def test_cross_entropy_valid_calls_end_at_the_device(logits: torch.Tensor, target: torch.Tensor, kwargs: dict) -> None:
    with _raises(ValueError, CE, "argument 'logits' must be a CUDA tensor"):
        ops.cross_entropy(logits, target, **kwargs)


GEMM = "cuteforge.ops.gemm"


@pytest.mark.parametrize(("args", "kwargs", "error", "part"), [
    ((None, B), {}, TypeError, "argument 'a' must be a torch.Tensor"),
    ((A, np.ones((16, 8))), {}, TypeError, "argument 'b' must be a torch.Tensor"),
    ((A.float(), B.float()), {}, TypeError, "argument 'a' has dtype float32"),
    ((A, B.half()), {}, TypeError, "they must match"),
    ((A.to(F8), B), {}, TypeError, "an fp8 GEMM needs both operands fp8"),
    ((A[0], B), {}, ValueError, "argument 'a' must be 2-D or 3-D"),
    ((A, B[:8]), {}, ValueError, "a.shape[-1] == b.shape[-2]"),
    ((A.expand(2, 4, 16), B.expand(3, 16, 8)), {}, ValueError, "batch sizes differ"),
    ((A, B), {"bias": [0.0] * 8}, TypeError, "argument 'bias' must be a torch.Tensor"),
    ((A, B), {"bias": torch.ones(7).bfloat16()}, ValueError, "argument 'bias' must be a per-column operand"),
    ((A, B), {"bias": torch.ones(4, 8).bfloat16()}, ValueError, "argument 'bias' must be a per-column operand"),
    ((A, B), {"bias": torch.ones(8, dtype=torch.float64)}, TypeError, "argument 'bias' has dtype float64"),
    ((A, B), {"c": torch.ones(3, 8).bfloat16()}, ValueError, "argument 'c' must be an operand that broadcasts"),
    ((A, B), {"c": [1.0], "beta": 0.0}, TypeError, "argument 'c' must be a torch.Tensor"),
    ((A, B), {"residual": torch.ones(2, 4, 8).bfloat16()}, ValueError, "argument 'residual' must be an operand"),
    ((A, B), {"epilogue": "gelu_erf"}, ValueError, "epilogue must be one of"),
    ((A, B), {"epilogue": 1}, TypeError, "epilogue must be None"),
    ((A, B), {"epilogue": "relu", "epilogue_args": {"s": W}}, TypeError, "epilogue_args is for a cuteforge.fusion.Epilogue"),
    ((A, B), {"alpha": "1"}, TypeError, "argument 'alpha' must be a Python number"),
    ((A, B), {"beta": True}, TypeError, "argument 'beta' must be a Python number"),
    ((A, B), {"alpha": 1j}, TypeError, "argument 'alpha' must be a Python number"),
    ((A, B), {"out_dtype": torch.int32}, TypeError, "out_dtype must be float32, bfloat16 or float16"),
    ((A, B), {"out_dtype": "bfloat16"}, TypeError, "out_dtype must be float32, bfloat16 or float16"),
    ((A, B), {"config": {"tile_m": 128}}, TypeError, "config must be a GemmConfig or None"),
    ((A, B), {"scale_a": 1.0}, TypeError, "scale_a applies to float8 inputs only"),
    ((A8, B8), {}, TypeError, "missing scale_a, scale_b"),
    ((A8, B8), {"scale_a": 1.0}, TypeError, "missing scale_b"),
    ((A8, B8), {"scale_a": "1", "scale_b": 1.0}, TypeError, "argument 'scale_a' must be a float or a one-element"),
    ((A8, B8), {"scale_a": torch.ones(1, dtype=torch.float64), "scale_b": 1.0}, TypeError, "argument 'scale_a' must be float32"),
    ((A8, B8), {"scale_a": torch.ones(1, 4), "scale_b": 1.0}, ValueError, "argument 'scale_a' must be a per-tensor scale"),
    ((A8, B8), {"scale_a": 1.0, "scale_b": torch.ones(8, 1)}, ValueError, "argument 'scale_b' must be a per-tensor scale"),
    ((A8[:, :8], torch.randn(8, 8).to(F8).t()), {"scale_a": 1.0, "scale_b": 1.0}, ValueError, "K to be a multiple of 16"),
    ((A8, torch.randn(16, 8).to(F8)), {"scale_a": 1.0, "scale_b": 1.0}, ValueError, "needs 'b' column-major"),
    ((torch.randn(16, 4).to(F8).t(), B8), {"scale_a": 1.0, "scale_b": 1.0}, ValueError, "needs 'a' row-major"),
    ((A8, B8), {"scale_a": torch.ones(4, 1), "scale_b": torch.ones(1, 8), "bias": torch.ones(8).bfloat16(),
                "c": torch.ones(4, 8).bfloat16()}, ValueError, "at most 3 tensor operands"),
], ids=lambda v: repr(v)[:30])
def test_gemm_arguments(args: tuple, kwargs: dict, error: type[Exception], part: str) -> None:
    with _raises(error, GEMM, part):
        ops.gemm(*args, **kwargs)


@pytest.mark.parametrize(("args", "kwargs"), [
    ((A, B), {}), ((A.expand(2, 4, 16), B), {}), ((A[:0], B), {}), ((A[:, :0], B[:0]), {}),
    ((torch.randn(16, 4).bfloat16().t(), B), {}), ((A.clone().requires_grad_(), B), {}),
    ((A, B), {"bias": torch.ones(4, 1).bfloat16()}), ((A, B), {"bias": torch.ones(8)}),
    ((A, B), {"epilogue": "none"}), ((A, B), {"out_dtype": torch.float32}),
    ((A.to("meta"), B.to("meta")), {}),
    ((A8, B8), {"scale_a": 1.0, "scale_b": 1.0}), ((A8, B8), {"scale_a": torch.ones(4, 1), "scale_b": torch.ones(1, 8)}),
    ((A8, B8), {"scale_a": torch.tensor(1.0), "scale_b": torch.ones(8)}),
], ids=lambda v: repr(v)[:30])
def test_gemm_valid_calls_end_at_the_device(args: tuple, kwargs: dict) -> None:
    with _raises(ValueError, GEMM, "argument 'a' must be a CUDA tensor"):
        ops.gemm(*args, **kwargs)


EMB = "cuteforge.ops.embedding"
IDS = torch.tensor([[0, 1], [2, 3]])
TABLE = torch.randn(10, 4)


@pytest.mark.parametrize(("ids", "weight", "padding_idx", "error", "part"), [
    (None, TABLE, None, TypeError, "argument 'ids' must be a torch.Tensor"),
    (IDS.float(), TABLE, None, TypeError, "argument 'ids' has dtype float32; supported: int32, int64"),
    (IDS.bool(), TABLE, None, TypeError, "argument 'ids' has dtype bool; supported: int32, int64"),
    (IDS.to(torch.int16), TABLE, None, TypeError, "argument 'ids' has dtype int16; supported: int32, int64"),
    (IDS, TABLE, 1.5, TypeError, "argument 'padding_idx' must be an int"),
    (IDS, TABLE, "a", TypeError, "argument 'padding_idx' must be an int"),
    (IDS, None, None, TypeError, "argument 'weight' must be a torch.Tensor"),
    (IDS, TABLE.long(), None, TypeError, "argument 'weight' must be a floating tensor"),
    (IDS, TABLE[0], None, ValueError, "argument 'weight' must be 2-D"),
    (IDS.to("meta"), TABLE, None, ValueError, "argument 'weight' is on cpu but 'ids' is on meta"),
    (IDS, TABLE, 10, ValueError, "argument 'padding_idx' must be within the 10 rows"),
    (IDS, TABLE, -11, ValueError, "argument 'padding_idx' must be within the 10 rows"),
], ids=lambda v: repr(v)[:30])
def test_embedding_arguments(ids: object, weight: object, padding_idx: object, error: type[Exception], part: str) -> None:
    with _raises(error, EMB, part):
        ops.embedding(ids, weight, padding_idx)


LCE = "cuteforge.ops.linear_cross_entropy"


@pytest.mark.parametrize(("args", "kwargs", "error", "part"), [
    ((None, WL, T), {}, TypeError, "argument 'x' must be a torch.Tensor"),
    ((XL, "w", T), {}, TypeError, "argument 'weight' must be a torch.Tensor"),
    ((XL, WL, [0]), {}, TypeError, "argument 'target' must be a torch.Tensor"),
    ((XL[0], WL, T), {}, ValueError, "must be 2-D"),
    ((XL, WL[:, :8]), {}, ValueError, "argument 'weight' has 8 columns but 'x' has 16"),
    ((XL, WL.bfloat16(), T), {}, TypeError, "arguments 'x' and 'weight' must share one of"),
    ((XL.double(), WL.double(), T), {}, TypeError, "arguments 'x' and 'weight' must share one of"),
    ((XL, WL, T[:3]), {}, ValueError, "argument 'target' must have shape (4,)"),
    ((XL.view(2, 2, -1), WL, T.view(4, 1)), {}, ValueError, "argument 'target' must have shape (2, 2)"),
    ((XL, WL, T.int()), {}, TypeError, "argument 'target' must be int64"),
    ((XL, WL[:0], T), {}, ValueError, "argument 'weight' must have V >= 1 rows"),
    ((XL, WL, T), {"ignore_index": 2**70}, ValueError, "does not fit in int64"),
    ((XL, WL, T), {"reduction": "none"}, ValueError, "argument 'reduction' must be 'mean' or 'sum'"),
    ((XL, WL, T), {"ignore_index": 1.5}, TypeError, "argument 'ignore_index' must be an int"),
    ((XL, WL, T), {"ignore_index": True}, TypeError, "argument 'ignore_index' must be an int"),
    ((XL, WL, T), {}, ValueError, "argument 'x' must be a CUDA tensor"),
    ((XL, WL, T), {"ignore_index": np.int64(-1)}, ValueError, "argument 'x' must be a CUDA tensor"),
    ((XL.to("meta"), WL.to("meta"), T.to("meta")), {}, ValueError, "argument 'x' must be a CUDA tensor"),
    ((XL, WL.to("meta"), T), {}, ValueError, "argument 'weight' is on meta but 'x' is on cpu"),
], ids=lambda v: repr(v)[:30])
def test_linear_cross_entropy_arguments(args: tuple, kwargs: dict, error: type[Exception], part: str) -> None:
    if len(args) == 2:
        args = (*args, T)
    with _raises(error, LCE, part):
        ops.linear_cross_entropy(*args, **kwargs)


SPARSE = {"coo": X.to_sparse(), "csr": X.to_sparse_csr(),
          "nested": torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(2, 8)])}


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("kind", list(SPARSE))
def test_a_sparse_or_nested_x_is_named(op: str, kind: str) -> None:
    """The warm paths' memo keys read strides and data pointers, which such tensors lack:
    the lookup misses and the checks name the argument."""
    with _raises(TypeError, f"cuteforge.ops.{op}", "argument 'x' must be a dense (strided) tensor"):
        ROW_OPS[op](SPARSE[kind])


def test_a_sparse_operand_of_cross_entropy_gemm_and_embedding_is_named() -> None:
    with _raises(TypeError, "argument 'logits' must be a dense (strided) tensor"):
        ops.cross_entropy(X.to_sparse(), T)
    with _raises(TypeError, "argument 'a' must be a dense (strided) tensor"):
        ops.gemm(A.to_sparse(), B)
    with _raises(TypeError, "argument 'ids' must be a dense (strided) tensor"):
        ops.embedding(torch.zeros(2, 2, dtype=torch.int64).to_sparse(), torch.randn(4, 8))


@pytest.mark.parametrize("op", REDUCTIONS)
def test_a_huge_expanded_cpu_x_is_not_copied_before_the_device_error(op: str) -> None:
    x = torch.zeros(1, 1).expand(2**20, 2**16)  # 256 GiB if copied
    with _raises(ValueError, f"cuteforge.ops.{op}", "argument 'x' must be a CUDA tensor"):
        getattr(ops, op)(x)
    with _raises(TypeError, f"cuteforge.ops.{op}", "argument 'x' has dtype int64"):
        getattr(ops, op)(torch.zeros(1, 1, dtype=torch.int64).expand(4, 8))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [torch.tensor([0, 1]), torch.tensor([]), torch.tensor(0, device="meta")], ids=str)
def test_softmax_tensor_dim_is_named(op: str, dim: torch.Tensor) -> None:
    with _raises(TypeError, f"cuteforge.ops.{op}", "'dim'"):
        getattr(ops, op)(X, dim)


def test_numpy_bool_keepdim_and_a_non_bool_check_targets() -> None:
    with _raises(ValueError, "argument 'x' must be a CUDA tensor"):
        ops.sum(X, -1, np.bool_(True))
    with _raises(TypeError, "argument 'keepdim' must be a bool, got numpy."):
        ops.sum(X, -1, np.int64(1))
    with _raises(TypeError, "argument 'check_targets' must be a bool"):
        ops.cross_entropy(X, T, check_targets="no")
    with _raises(ValueError, "argument 'reduction' must be one of"):
        ops.cross_entropy(X, T, reduction=np.array(["mean", "sum"]))


def test_nn_modules_name_bad_constructor_arguments_and_pass_non_tensors_to_torch() -> None:
    import cuteforge.nn as cnn

    for bad, error, part in (("a", TypeError, "'normalized_shape' must be an int"),
                             (4.5, TypeError, "'normalized_shape' must be an int"),
                             (-1, ValueError, "'normalized_shape' must be positive"),
                             (True, TypeError, "'normalized_shape' must be an int")):
        with _raises(error, "cuteforge.nn.RMSNorm", part):
            cnn.RMSNorm(bad)
    for eps in (-1.0, float("nan")):
        with _raises(ValueError, "cuteforge.nn.LayerNorm", "'eps' must be a non-negative number"):
            cnn.LayerNorm(8, eps=eps)
    with _raises(ValueError, "cuteforge.nn.Linear", "activation must be one of"):
        cnn.Linear(8, 8, activation=["relu"])
    for module in (cnn.RMSNorm(8), cnn.LayerNorm(8), cnn.Linear(8, 8)):
        with pytest.raises(TypeError):  # torch's own error for a non-tensor, not an AttributeError
            module(None)
