"""Arch targets and checks; signatures, keys and alignment. CPU only."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cuteforge import arch
from cuteforge.signature import BoundKey, Signature, TensorArg, check_key_part, vector_width


def test_parse_and_name_arch() -> None:
    assert arch.parse_arch("sm_90a") == 90 and arch.parse_arch("sm_80") == 80 and arch.parse_arch("SM_100a") == 100
    assert arch.arch_name(90) == "sm_90a" and arch.arch_name(80) == "sm_80" and arch.arch_name(100) == "sm_100a"
    for bad in ("90", "sm_", "sm_x", "compute_90"):
        with pytest.raises(ValueError, match="sm_90a"):
            arch.parse_arch(bad)


def test_target_arch_follows_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_ARCH", "sm_100a")
    assert arch.target_arch() == "sm_100a"
    monkeypatch.setenv("CUTEFORGE_ARCH", "hopper")
    with pytest.raises(ValueError, match="hopper"):
        arch.target_arch()


def test_check_arch_names_the_requirement() -> None:
    arch.check_arch("k", ("sm_80+",), "sm_90a")
    arch.check_arch("k", ("sm_90a",), "sm_90a")
    with pytest.raises(arch.ArchError, match=r"'k'.*sm_80.*requires sm_90a"):
        arch.check_arch("k", ("sm_90a",), "sm_80")
    with pytest.raises(arch.ArchError, match="requires sm_100a, sm_120a"):
        arch.check_arch("k", ("sm_100a", "sm_120a"), "sm_90a")


def test_arch_check_comes_before_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels_for_tests as kt

    from cuteforge import STATS

    monkeypatch.setenv("CUTEFORGE_ARCH", "sm_80")
    before = STATS.compiles
    with pytest.raises(arch.ArchError, match="test_sm90_only.*sm_80.*requires sm_90a"):
        kt.sm90_only.get(BoundKey(("float32",), (), (4,)))
    assert STATS.compiles == before


def test_device_limits_table() -> None:
    for sm in (80, 86, 89, 90, 100, 120):
        lim = arch.limits_for(sm)
        assert lim.threads_per_block == 1024 and lim.smem_per_block <= lim.smem_per_sm
    assert arch.limits_for("sm_90a").smem_per_block == 227 * 1024
    assert arch.limits_for(87).sm == 86  # unknown part: nearest older entry
    with pytest.raises(arch.ArchError):
        arch.limits_for(70)


@pytest.mark.parametrize(
    ("ptr", "strides", "esize", "want"),
    [
        (0x1000, (4096,), 4, 4),  # 16-byte aligned rows, fp32: 4 elements
        (0x1000, (4096,), 2, 8),  # bf16: 8 elements
        (0x1004, (4096,), 4, 1),  # pointer 4 bytes off
        (0x1008, (4096,), 4, 2),
        (0x1000, (1001,), 4, 1),  # odd row stride
        (0x1000, (1002,), 2, 2),
        (0x1000, (), 4, 4),  # 1-D
        (0x1000, (0,), 4, 4),  # broadcast stride
        (0x1001, (16,), 2, 1),  # misaligned to the element itself
        (0x1000, (16,), 16, 1),  # 16-byte elements: never wider
    ],
)
def test_vector_width(ptr: int, strides: tuple[int, ...], esize: int, want: int) -> None:
    assert vector_width(ptr, strides, esize) == want


def test_keys_reject_tensors_and_mutables() -> None:
    check_key_part((1, 2.0, "a", None, True, torch.float16, (3, (4,))), "ok")
    with pytest.raises(TypeError, match=r"params\[1\] holds a torch.Tensor"):
        check_key_part(("x", torch.zeros(1)), "params")
    with pytest.raises(TypeError, match="list"):
        check_key_part([1, 2], "config")

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        threads: int
        extra: object = None

    check_key_part(Cfg(128), "config")
    with pytest.raises(TypeError, match=r"config.extra holds a torch.Tensor"):
        check_key_part(Cfg(128, torch.ones(1)), "config")


def test_compile_spec_rejects_a_tensor_param() -> None:
    import kernels_for_tests as kt

    with pytest.raises(TypeError, match="torch.Tensor"):
        kt.scale.get(BoundKey(("float32", "float32"), (), (4, 4)), (("factor", torch.tensor(2.0)),))


def test_signature_declaration_errors() -> None:
    with pytest.raises(ValueError, match="unique"):
        Signature(TensorArg("x", ("M",)), TensorArg("x", ("M",)))
    with pytest.raises(ValueError, match="static dim 'K'"):
        Signature(TensorArg("x", ("M",)), static=("K",))
    with pytest.raises(ValueError, match="dtype_like"):
        Signature(TensorArg("x", ("M",), dtype_like="y"))


def test_bind_rejects_cpu_and_non_tensors() -> None:
    sig = Signature(TensorArg("x", ("M", "N")), static=("N",))
    with pytest.raises(ValueError, match="'x' must be a CUDA tensor"):
        sig.bind((torch.zeros(2, 3),), "op")
    with pytest.raises(TypeError, match="'x' must be a torch.Tensor, got list"):
        sig.bind(([1, 2],), "op")
    with pytest.raises(TypeError, match="expected 1 tensors"):
        sig.bind((), "op")


def test_fake_args_share_symbols_and_bake_static_dims() -> None:
    sig = Signature(TensorArg("x", ("M", "N")), TensorArg("out", ("M",)), static=("N",))
    x, out = sig.fake_args(BoundKey(("bfloat16", "float32"), (("N", 4096),), (8, 4)))
    assert x.shape[1] == 4096 and x.shape[0] is out.shape[0]
    assert x.stride[1] == 1


def test_column_major_leading_dim() -> None:
    sig = Signature(TensorArg("a", ("M", "K"), leading=0))
    (a,) = sig.fake_args(BoundKey(("float16",), (), (8,)))
    assert a.stride[0] == 1 and a.stride[1] != 1
    with pytest.raises(ValueError, match="leading=2"):
        TensorArg("a", ("M", "K"), leading=2)
    assert TensorArg("a", ("M", "K"), leading=-2).leading == 0


def test_duplicate_kernel_name_is_an_error() -> None:
    import cuteforge

    with pytest.raises(ValueError, match="already exists"):
        cuteforge.kernel(name="test_scale", signature=Signature(TensorArg("x", ("M",))))(lambda spec: None)
