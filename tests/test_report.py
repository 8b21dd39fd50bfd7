"""Benchmark reports from the recorded H200 results: plots, the HTML page, bad input, and
the page as headless Chromium renders it (skipped where no Chromium is installed)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cuteforge.bench import report

RESULTS = Path(__file__).resolve().parent / "data"  # frozen copies of recorded H200 results
FILES = [RESULTS / "h200-sum.json", RESULTS / "h200-dispatch.json", RESULTS / "h200-autotune.json"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return report.load_results(FILES)


@pytest.fixture(scope="module")
def page(results: list[dict], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return report.html_report(results, tmp_path_factory.mktemp("report") / "report.html")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.imgs: list[dict[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(dict(attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


def test_families(results: list[dict]) -> None:
    assert report.family_names(results) == ["sum"]  # config_sweep and tune rows are not families
    rows = report.table_rows(results, "sum")
    assert len(rows) == 18
    r = next(r for r in rows if r["shape"] == "16384x16384" and r["dtype"] == "float32")
    assert r["values"] == {"cuteforge": 4445.2, "torch": 4053.0, "torch.compile": 4256.3}
    assert r["best"] == "cuteforge" and r["pct"]["cuteforge"] == 104.5 and r["correct"] is True
    # a `cuteforge library --json` style result: rows under "rows", split by op
    lib = {"gpu": "G", "command": "x", "copy_GBps": 100.0, "rows": [{"op": "amax", "M": 2, "N": 8, "dtype": "float32", "cuteforge_GBps": 50.0}]}
    assert list(report.families(lib)) == ["amax"]
    assert report.table_rows([lib], "amax")[0]["pct"] == {"cuteforge": 50.0}


def test_plots(results: list[dict], tmp_path: Path) -> None:
    paths = report.plot_results(results, tmp_path / "plots")
    assert paths == [tmp_path / "plots" / "sum.png"]
    data = paths[0].read_bytes()
    assert data[:8] == PNG_MAGIC and 10_000 < len(data) < 200_000


def test_plot_grid_one_panel_per_family(tmp_path: Path) -> None:
    rows = [{"op": op, "M": 1024, "N": n, "dtype": "float32", "cuteforge_GBps": 100.0 * n, "torch_GBps": 50.0 * n}
            for op in ("softmax", "softmax_bwd", "rms_norm") for n in (256, 4096)]
    res = [{"gpu": "NVIDIA H200", "command": "x", "copy_GBps": 4000.0, "membound": rows}]
    png = report.plot_grid(res, tmp_path / "grid.png", columns=2)
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="no families"):
        report.plot_grid([{"gpu": "x", "host_us": {}}], tmp_path / "none.png")


def test_gemm_family_plots_against_cublas(tmp_path: Path) -> None:
    rows = [{"op": "gemm", "M": n, "N": n, "K": n, "dtype": "bfloat16", "correct": True,
             "cuteforge_TFLOPs": 0.8 * n / 16, "cublas_TFLOPs": n / 16} for n in (1024, 2048, 4096, 8192)]
    res = [{"gpu": "NVIDIA H200", "command": "x", "gemm": rows}]
    (tmp_path / "g.json").write_text(json.dumps(res[0]))
    res = report.load_results([tmp_path / "g.json"])  # no copy_GBps needed for TFLOP/s rows
    t = report.table_rows(res, "gemm")
    assert t[0]["unit"] == "TFLOP/s" and t[0]["ref"] == "cuBLAS" and t[0]["pct"]["cuteforge"] == 80.0
    assert t[0]["shape"] == "1024x1024x1024" and t[0]["best"] == "cublas"
    png = report.plot_family(res, "gemm", tmp_path / "gemm.png").read_bytes()
    assert png[:8] == PNG_MAGIC


def test_html_content(results: list[dict], page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    p = _parse(page)
    body = " ".join(p.text)
    assert "NVIDIA H200" in body
    assert len(p.imgs) == len(report.family_names(results)) == 1
    src = p.imgs[0]["src"] or ""
    assert src.startswith("data:image/png;base64,")
    assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    assert "4,201.6" in body and "98.8" in body  # sum 32768x4096 float32, cuteforge GB/s and % copy
    assert text.count('class="best"') == 2 * 18  # one best implementation per row (GB/s and % cells)
    for heading in ("Host overhead", "Compile cache", "Autotuning", "Tuned shapes", "Results files"):
        assert heading in p.text
    assert "7.03" in body and "cuteforge.ops.sum(x)" in body  # host overhead from both files
    assert "254.84" in body and "2.31" in body  # cold vs warm first call
    assert "11.29" in body  # 16-worker warm compile speed-up
    assert "python benchmarks/bench_sum.py --out /root/out/h200-sum.json" in body
    assert "script" not in p.tags and "link" not in p.tags and "http" not in text  # self-contained, no JS


def test_html_escapes(tmp_path: Path) -> None:
    r = json.loads(FILES[0].read_text())
    r["gpu"] = "<script>alert('x')</script> & co"
    r["command"] = 'bench --x "<em>"'
    r["host_overhead"]["<img src=x onerror=alert(1)>_us"] = 1.0
    (tmp_path / "evil.json").write_text(json.dumps(r))
    out = report.html_report(report.load_results([tmp_path / "evil.json"]), tmp_path / "evil.html")
    text = out.read_text(encoding="utf-8")
    assert "<script>" not in text and "<em>" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in text
    p = _parse(out)
    assert "script" not in p.tags and "em" not in p.tags
    assert "bench --x \"<em>\"" in " ".join(p.text)  # shown as text
    assert len(p.imgs) == 1


@pytest.mark.parametrize(("content", "match"), [
    ("{not json", "not a results JSON file"),
    ("[1, 2]", "expected a JSON object"),
    ('{"command": "x"}', "missing key 'gpu'"),
    ('{"gpu": "G", "command": "x", "copy_GBps": 1, "sum": [{"M": 1, "dtype": "float32", "cuteforge_GBps": 1.0}]}', r"sum\[0\] lacks 'N'"),
    ('{"gpu": "G", "command": "x", "copy_GBps": 1, "sum": [{"M": 1, "N": "4", "dtype": "f", "cuteforge_GBps": 1.0}]}', "must be integers"),
    ('{"gpu": "G", "command": "x", "copy_GBps": 1, "sum": [{"M": 1, "N": 4, "dtype": "f", "cuteforge_GBps": "fast"}]}', "is not a number"),
    ('{"gpu": "G", "command": "x", "sum": [{"M": 1, "N": 4, "dtype": "float32", "cuteforge_GBps": 1.0}]}', "missing key 'copy_GBps'"),
    ('{"gpu": "G", "command": "x"}', "nothing to report"),
])
def test_bad_results(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "bad-results.json"
    f.write_text(content)
    with pytest.raises(ValueError, match=match) as e:
        report.load_results([FILES[0], f])
    assert str(f) in str(e.value)


def test_missing_file_and_no_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope.json: cannot read"):
        report.load_results([tmp_path / "nope.json"])
    with pytest.raises(ValueError, match="no results files"):
        report.load_results([])


def test_bench_main_from_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = report.bench_main([], None, "float32", [str(f) for f in FILES], None, str(tmp_path / "p"), str(tmp_path / "r.html"))
    assert len(res) == 3 and (tmp_path / "p" / "sum.png").exists() and (tmp_path / "r.html").exists()
    report.print_tables(res)
    out = capsys.readouterr().out
    assert "sum on NVIDIA H200" in out and "4,445" in out
    with pytest.raises(ValueError, match="--from reports recorded results"):
        report.bench_main(["sum"], None, "float32", [str(FILES[0])], None, None, None)


def test_run_bench_input_errors() -> None:
    with pytest.raises(ValueError, match="unknown op 'softmx'"):
        report.run_bench(["softmx"])
    from cuteforge import arch

    if arch.compile_only():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            report.run_bench(["sum"])


def _chromium() -> str | None:
    for name in (os.environ.get("CUTEFORGE_CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def test_html_renders_in_headless_chromium(page: Path, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium / google-chrome binary on PATH (set CUTEFORGE_CHROMIUM to point at one)")
    shot = tmp_path / "report.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.exists(), f"chromium wrote no screenshot (rc {r.returncode}): {r.stderr[-2000:]}"
    assert shot.read_bytes()[:8] == PNG_MAGIC and shot.stat().st_size > 20_000
    import matplotlib.image as mpimg
    import numpy as np

    px = mpimg.imread(shot)[..., :3]
    assert px.shape[:2] == (2000, 1280)
    assert (px != px[0, 0]).any(axis=-1).mean() > 0.03, "the page rendered (nearly) blank"
    # the embedded plot rendered: pixels of the cuteforge line colour (#1f77b4) are on the page
    blue = np.abs(px - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=-1) < 0.06
    assert blue.sum() > 200, "no plot pixels: the data-URI image did not render"
    # the highlighted best cells (#d9f2dc) rendered too
    green = np.abs(px - np.array([0xD9, 0xF2, 0xDC]) / 255).max(axis=-1) < 0.02
    assert green.sum() > 2000, "no highlighted table cells"


def test_one_colour_per_implementation_everywhere() -> None:
    assert report.impl_color("cuteforge") == report.IMPL_COLORS["cuteforge"]
    assert report.impl_color("torch") != report.impl_color("cuteforge")
    assert report.impl_color("some_new_impl") == report.impl_color("some_new_impl")


def test_rows_that_differ_by_variant_are_all_plotted(tmp_path: Path) -> None:
    rows = [{"M": 4096, "N": 4096, "K": 4096, "dtype": "e4m3", "scaling": s, "epilogue": e,
             "cuteforge_TFLOPs": 1000.0, "cublas_TFLOPs": 990.0} for s in ("tensor", "rowwise") for e in ("none", "gelu")]
    res = [{"gpu": "G", "command": "x", "fp8": rows}]
    import matplotlib.figure

    ax = matplotlib.figure.Figure().add_subplot()
    title = report._draw_family(ax, res, "fp8")
    assert "not plotted" not in title and len([ln for ln in ax.get_lines() if ln.get_label().startswith("cuteforge")]) == 4


def test_report_date_is_the_runs(tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"gpu": "G", "command": "x", "date": "2026-01-02", "host_us": {"a": 1.0}}))
    (r,) = report.load_results([f])
    assert r["_date"] == "2026-01-02"
    f.write_text(json.dumps({"gpu": "G", "command": "x", "host_us": {"a": 1.0}}))
    assert report.load_results([f])[0]["_date"] == "date not recorded"
