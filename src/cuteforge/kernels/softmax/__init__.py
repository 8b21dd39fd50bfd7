"""Softmax and log-softmax over the last dim, forward and backward (CuTe DSL)."""

from .config import MODES, SoftmaxConfig, candidate_configs, default_config, is_backward
from .device import make_softmax

__all__ = ["MODES", "SoftmaxConfig", "candidate_configs", "default_config", "is_backward", "make_softmax"]
