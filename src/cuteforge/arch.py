"""GPU detection, compile targets and the device-limits table configs validate against.

The target arch decides what `cute.compile` emits. On a machine with a GPU it is the
GPU's own SM ("a" variant where the chip has arch-specific instructions: wgmma on
sm_90a); `CUTEFORGE_ARCH` overrides it, which is how machines without a GPU compile
ahead of time. With neither, the default target is sm_90a (Hopper).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

DEFAULT_ARCH = "sm_90a"

# Compute capabilities whose arch-specific ("a") target is what a kernel wants: the
# feature set (wgmma, setmaxnreg, tcgen05) exists only under the "a" name.
_ARCH_SPECIFIC = {90, 100, 101, 103, 120, 121}


class ArchError(RuntimeError):
    """The GPU (or the compile target) is not one the kernel supports."""


@dataclass(frozen=True)
class DeviceLimits:
    """Per-SM hardware limits that kernel configs are validated against."""

    sm: int
    smem_per_block: int  # bytes a block may opt in to
    smem_per_sm: int
    registers_per_sm: int
    registers_per_thread: int
    threads_per_block: int
    threads_per_sm: int
    sm_count: int  # of the flagship part; the live count comes from the device
    max_cluster_size: int  # portable limit; 1 where clusters do not exist


_K = 1024
# Sources: CUDA C Programming Guide, "Technical Specifications per Compute Capability".
LIMITS: dict[int, DeviceLimits] = {
    80: DeviceLimits(80, 163 * _K, 164 * _K, 65536, 255, 1024, 2048, 108, 1),
    86: DeviceLimits(86, 99 * _K, 100 * _K, 65536, 255, 1024, 1536, 84, 1),
    89: DeviceLimits(89, 99 * _K, 100 * _K, 65536, 255, 1024, 1536, 128, 1),
    90: DeviceLimits(90, 227 * _K, 228 * _K, 65536, 255, 1024, 2048, 132, 8),
    100: DeviceLimits(100, 227 * _K, 228 * _K, 65536, 255, 1024, 2048, 148, 8),
    120: DeviceLimits(120, 99 * _K, 100 * _K, 65536, 255, 1024, 1536, 188, 8),
}


def parse_arch(arch: str) -> int:
    """'sm_90a' -> 90. Raises ValueError on anything else."""
    text = arch.strip().lower()
    if not text.startswith("sm_"):
        raise ValueError(f"arch must look like 'sm_90a', got {arch!r}")
    digits = text[3:].rstrip("af")
    if not digits.isdigit():
        raise ValueError(f"arch must look like 'sm_90a', got {arch!r}")
    return int(digits)


def arch_name(sm: int) -> str:
    """90 -> 'sm_90a', 80 -> 'sm_80'."""
    return f"sm_{sm}a" if sm in _ARCH_SPECIFIC else f"sm_{sm}"


def limits_for(arch: str | int) -> DeviceLimits:
    sm = parse_arch(arch) if isinstance(arch, str) else arch
    if sm in LIMITS:
        return LIMITS[sm]
    # An unknown newer part: take the closest older entry rather than failing.
    older = [k for k in LIMITS if k <= sm]
    if not older:
        raise ArchError(f"no device limits known for sm_{sm}")
    return LIMITS[max(older)]


@dataclass(frozen=True)
class GpuInfo:
    name: str
    sm: int
    sm_count: int
    index: int


@functools.cache
def gpu_info(index: int | None = None) -> GpuInfo | None:
    """The current (or given) CUDA device, or None on a machine with no usable GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(idx)
    return GpuInfo(props.name, props.major * 10 + props.minor, props.multi_processor_count, idx)


@functools.cache
def max_active_clusters(index: int, size: int) -> int | None:
    """Clusters of `size` CTAs, one per SM, that device `index` runs at once
    (cuOccupancyMaxActiveClusters through the DSL's HardwareInfo), or None where that
    cannot be asked (no driver bindings). A cluster lives on one GPC, so GPCs whose SM
    count is not a multiple of `size` hold fewer than sm_count / size: 30 clusters of 4
    on a 132-SM H200. A persistent grid sized past this runs its last clusters as a
    second round (or, waiting on their flags, hangs)."""
    if size == 1:
        info = gpu_info(index)
        return info.sm_count if info else None
    try:
        import torch
        from cutlass.utils import HardwareInfo

        with torch.cuda.device(index):
            # HardwareInfo asks the driver in the thread's current context: make it
            # exist (torch creates the primary context on its first allocation)
            torch.empty(1, device=f"cuda:{index}")
            return int(HardwareInfo(index).get_max_active_clusters(size)) or None
    except Exception:  # no driver bindings or no device: no cap known
        return None


def target_arch() -> str:
    """The arch kernels are compiled for: CUTEFORGE_ARCH, else the GPU's, else sm_90a."""
    env = os.environ.get("CUTEFORGE_ARCH")
    if env:
        parse_arch(env)  # validate early with a clear message
        return env.strip().lower()
    info = gpu_info()
    return arch_name(info.sm) if info else DEFAULT_ARCH


def compile_only() -> bool:
    """True when kernels can be compiled but not launched here (no GPU, or a foreign target)."""
    info = gpu_info()
    return info is None or parse_arch(target_arch()) != info.sm


def check_arch(kernel: str, archs: tuple[str, ...], target: str | None = None) -> None:
    """Raise ArchError, naming the GPU and the SMs required, if `target` is not supported.

    `archs` entries are exact ('sm_90a') or open-ended ('sm_80+': that SM and newer).
    """
    target = target or target_arch()
    sm = parse_arch(target)
    for spec in archs:
        if spec.endswith("+"):
            if sm >= parse_arch(spec[:-1]):
                return
        elif parse_arch(spec) == sm:
            return
    info = gpu_info()
    where = f"the GPU {info.name} (SM {info.sm // 10}.{info.sm % 10})" if info and not os.environ.get(
        "CUTEFORGE_ARCH"
    ) else f"the compile target {target}"
    raise ArchError(
        f"kernel {kernel!r} does not support {where}: it requires {', '.join(archs)}"
    )
