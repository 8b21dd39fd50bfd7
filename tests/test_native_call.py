"""A kernel's call from Python through the C++ extension (cuteforge/native/ffi_call.cpp,
`call_function`) on the CPU: the "kernel" is a Python function exposed through TVM-FFI
(the C ABI the compiled CuTe kernels use), which sees what the call packed."""

from __future__ import annotations

import pytest
import torch

from cuteforge.native import build

pytestmark = pytest.mark.skipif(build.load() is None, reason="the C++ extension could not be built here")


def _ffi(f):
    import tvm_ffi

    return tvm_ffi.convert(f)


def _call(f, *args):
    fn = _ffi(f)
    return build.load().call_function(fn.__chandle__(), *args)


def test_tensors_pass_as_views_of_their_memory() -> None:
    seen = []

    def kernel(*ts):
        seen.extend((tuple(t.shape), tuple(t.strides), t.data_ptr if isinstance(t.data_ptr, int) else t.data_ptr(),
                     str(t.dtype)) for t in ts)

    x = torch.randn(4, 6)
    v = x[1:, ::2]  # an offset, strided view
    dtypes = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8, torch.bool)
    others = [torch.zeros(3, dtype=d) for d in dtypes]
    assert _call(kernel, v, *others) is None
    assert seen[0] == ((3, 3), (6, 2), v.data_ptr(), "float32")
    assert [s[3] for s in seen[1:]] == ["bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "bool"]


def test_scalars_pass_and_returns_come_back() -> None:
    assert _call(lambda a, b, c, d: [a, b, c, d] == [None, True, 7, 2.5], None, True, 7, 2.5) is True
    assert _call(lambda a: a + 1, 41) == 42 and _call(lambda a: a * 2, 1.25) == 2.5
    with pytest.raises(TypeError, match="only tvm_ffi converts"):  # a string: kernels return none
        _call(lambda a: "ab" * a, 3)


@pytest.mark.parametrize("arg", ["a string", 2**70, torch.zeros(2, dtype=torch.complex64), torch.zeros(2).to_sparse()])
def test_arguments_it_does_not_pack_return_not_implemented_before_calling(arg: object) -> None:
    called = []
    assert _call(lambda *a: called.append(a), torch.zeros(2), arg) is NotImplemented
    assert called == []


@pytest.mark.parametrize("error, kind", [(ValueError, ValueError), (TypeError, TypeError), (KeyError, KeyError),
                                         (ZeroDivisionError, RuntimeError)])
def test_errors_come_back_as_their_kind(error: type, kind: type) -> None:
    def kernel(x):
        raise error("the kernel refused this")

    with pytest.raises(kind, match="the kernel refused this"):
        _call(kernel, torch.zeros(2))


def test_no_handle_is_refused() -> None:
    with pytest.raises(ValueError, match="null function handle"):
        build.load().call_function(0)
    with pytest.raises(TypeError):
        build.load().call_function("not a handle")
