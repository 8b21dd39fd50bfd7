"""Re-serialize benchmarks/results/*.json without whitespace (content unchanged, checked by a
round trip). The device tool carries the working tree beside the 58 MB DSL bundle within
64 MiB; the benchmarks write indented JSON, so run this before committing new results.

    python3 scripts/compact_results.py
"""

from __future__ import annotations

import json
from pathlib import Path


def main() -> None:
    saved = 0
    for path in sorted(Path(__file__).parent.parent.glob("benchmarks/results/*.json")):
        text = path.read_text()
        data = json.loads(text)
        compact = json.dumps(data, separators=(",", ":")) + "\n"
        if json.loads(compact) != data:
            raise SystemExit(f"{path}: the round trip changed the content")
        if len(compact) < len(text):
            path.write_text(compact)
            saved += len(text) - len(compact)
    print(f"{saved} bytes saved")


if __name__ == "__main__":
    main()
