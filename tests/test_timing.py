"""cuteforge.timing's flush mode (CPU: the switch itself; the GPU figures are in
docs/kernels/reduce.md)."""

import pytest

from cuteforge import timing


def test_flush_mode_switch_and_bad_mode():
    assert timing.FLUSH_MODES == ("zero", "read")
    try:
        timing.set_flush_mode("read")
        assert timing._flush_mode == "read"
        with pytest.raises(ValueError, match=r"flush mode 'clean'.*'zero', 'read'"):
            timing.set_flush_mode("clean")
        assert timing._flush_mode == "read"
    finally:
        timing.set_flush_mode("zero")
    assert timing._flush_mode == "zero"
