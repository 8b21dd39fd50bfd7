"""Drop-in modules on cuteforge's ops, and `patch` for transformers models."""

from .modules import (
           CrossEntropyLoss,
           Embedding,
           LayerNorm,
           Linear,
           RMSNorm,
           SwiGLUMLP,
           causal_lm_loss,
)
from .patch import SUPPORTED, PatchReport, patch, unpatch

__all__ = ["CrossEntropyLoss", "Embedding", "LayerNorm", "Linear", "RMSNorm", "SwiGLUMLP", "causal_lm_loss",
           "PatchReport", "SUPPORTED", "patch", "unpatch"]
