"""Torch-facing ops. Each is also registered as `torch.ops.cuteforge.<name>`, except the
pointwise `silu_mul` and `rotary_embedding`, which trace as their torch expressions under
torch.compile (Inductor fuses those itself)."""

from .cross_entropy import cross_entropy
from .embedding import embedding
from .gated_gemm import gated_gemm
from .gemm import gemm
from .linear_cross_entropy import linear_cross_entropy
from .norm import layer_norm, rms_norm
from .reduce import amax, amin, argmax, mean, sum  # noqa: A004
from .rotary import rotary_embedding
from .softmax import log_softmax, softmax
from .swiglu import silu_mul

__all__ = ["sum", "mean", "amax", "amin", "argmax", "softmax", "log_softmax", "cross_entropy", "embedding", "linear_cross_entropy", "gemm", "gated_gemm", "rms_norm", "layer_norm",
           "silu_mul", "rotary_embedding"]
