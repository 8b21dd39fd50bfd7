"""The old import path of the cross-entropy device code (`device.py`), for the ops that
still import these names from here."""

from .device import WORK_ZERO, reduce_fits, work_words

__all__ = ["WORK_ZERO", "reduce_fits", "work_words"]
