"""Run in a subprocess by the cache tests: compile (or load) one test kernel and report.

argv: variant (an int folded into the compile params, so tests can pick distinct keys).
Prints one JSON line with this process's cache counters.
"""

import json
import sys
import warnings

import kernels_for_tests as kt

from cuteforge import STATS
from cuteforge.signature import BoundKey

variant = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
key = BoundKey(("float32", "float32"), (), (4, 4))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fn = kt.scale.get(key, (("factor", variant),))
print(json.dumps({**STATS.as_dict(), "callable": callable(fn), "warnings": [str(w.message) for w in caught],
                  "kind": type(fn).__name__, "tvm_ffi": "tvm_ffi" in sys.modules}))
