"""Torch-facing ops. Each is also registered as `torch.ops.cuteforge.<name>`."""

from .reduce import amax, amin, argmax, mean, sum  # noqa: A004

__all__ = ["sum", "mean", "amax", "amin", "argmax"]
