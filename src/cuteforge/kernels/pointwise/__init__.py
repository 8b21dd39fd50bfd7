"""Pointwise kernels: the SwiGLU activation (`silu_mul`, `silu_mul_backward`) and the
rotary position embedding (`rotary_embedding`, forward and backward by its ``backward``
parameter). The device code is in `swiglu.py` and `rotary.py`."""

from .spec import rotary_embedding, silu_mul, silu_mul_backward

__all__ = ["rotary_embedding", "silu_mul", "silu_mul_backward"]
