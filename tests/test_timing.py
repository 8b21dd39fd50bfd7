"""cuteforge.timing's flush mode (CPU: the switch itself; the GPU figures are in
docs/kernels/reduce.md)."""

import pytest

from cuteforge.timing import events as timing


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


def test_stream_interleaves_and_divides_by_calls(monkeypatch):
    """timing.stream (CPU, synchronize stubbed): every contender warmed up, then timed once
    per round with the first contender rotating; per-call time is the loop's wall time over
    `calls`, so a contender that sleeps 2 ms per call reads ~2 ms and one that does nothing
    reads far less."""
    import time

    syncs = []
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: syncs.append(1))
    order: list[str] = []
    counts = {"slow": 0, "fast": 0}

    def slow():
        counts["slow"] += 1
        order.append("slow")
        time.sleep(0.002)

    def fast():
        counts["fast"] += 1
        order.append("fast")

    out = timing.stream({"slow": slow, "fast": fast}, calls=3, rounds=4, warmup=2)
    assert counts == {"slow": 2 + 3 * 4, "fast": 2 + 3 * 4}
    assert 1.9 < out["slow"] < 20 and out["fast"] < 0.5, out
    timed = order[4:]  # after the warm-up: blocks of 3 calls, first contender rotating per round
    firsts = [timed[i * 6] for i in range(4)]
    assert firsts == ["slow", "fast", "slow", "fast"], firsts
    assert len(syncs) == 1 + 2 * 2 * 4  # after the warm-up, then before and after each timed loop
    with pytest.raises(ValueError, match="calls=0"):
        timing.stream({"fast": fast}, calls=0)


def test_measure_rejects_unknown_timer():
    from cuteforge.bench.library import measure

    with pytest.raises(ValueError, match=r"timer='wall'.*'event', 'stream'"):
        measure("sum", 1, 256, timing.torch.float32, {}, 1.0, timer="wall")


def test_stream_drops_a_failing_contender(monkeypatch):
    """A contender that raises (in its warm-up or in a timed loop) is dropped and reported in
    `errors`; the others are still timed. Without `errors` the exception propagates. No
    contenders: no times."""
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    calls = {"n": 0}

    def late_fail():
        calls["n"] += 1
        if calls["n"] > 3:  # after the warm-up: in the first timed loop
            raise RuntimeError("boom")

    def bad():
        raise ValueError("bad input")

    errors: dict = {}
    out = timing.stream({"ok": lambda: None, "bad": bad, "late": late_fail}, calls=2, rounds=3, warmup=3, errors=errors)
    assert set(out) == {"ok"} and set(errors) == {"bad", "late"}
    assert isinstance(errors["bad"], ValueError) and isinstance(errors["late"], RuntimeError)
    with pytest.raises(ValueError, match="bad input"):
        timing.stream({"bad": bad}, warmup=1)
    assert timing.stream({}) == {}


def test_host_us_interleaved_rotates_and_host_us_is_its_single_case(monkeypatch):
    """timing.host_us_interleaved (CPU, synchronize stubbed): 200 warm-up calls each, then
    per loop every contender once, the first one rotating; microseconds per call. host_us
    is the one-contender case."""
    import time

    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    order: list[str] = []

    def make(name: str, sleep_s: float):
        def fn() -> None:
            order.append(name)
            if sleep_s:
                time.sleep(sleep_s)
        return fn

    us = timing.host_us_interleaved({"a": make("a", 0.0), "b": make("b", 0.001)}, calls=3, loops=4)
    assert order[:400] == ["a"] * 200 + ["b"] * 200
    timed = order[400:]
    assert len(timed) == 4 * 2 * 3
    firsts = [timed[i * 6] for i in range(4)]
    assert firsts == ["a", "b", "a", "b"]
    assert us["b"] >= 900 and us["a"] < us["b"] / 5
    order.clear()
    assert timing.host_us(make("c", 0.0), calls=2, loops=3) < 900
    assert order == ["c"] * (200 + 6)


def test_measure_stream_repeat_keeps_each_runs_ratio(monkeypatch):
    """library_bench.measure with the stream timer and repeat=3 (CPU: inputs on the CPU,
    timing.stream stubbed with three runs): each contender's time is its median over the
    runs, and each run's torch / cuteforge ratio is kept; with repeat=1 there is no list."""
    import torch

    from cuteforge.bench import library as library_bench

    monkeypatch.setattr(library_bench, "inputs", lambda op, m, n, dtype: (torch.randn(m, n),))
    runs = iter([{"torch": 1.0, "cuteforge": 0.5}, {"torch": 1.2, "cuteforge": 1.5}, {"torch": 0.9, "cuteforge": 0.6}])
    seen: list[set[str]] = []

    def fake_stream(calls, errors=None):
        seen.append(set(calls))
        return next(runs)

    monkeypatch.setattr(library_bench.timing, "stream", fake_stream)
    fns = {"torch": lambda x: torch.softmax(x, -1), "cuteforge": lambda x: torch.softmax(x, -1)}
    row = library_bench.measure("softmax", 1024, 1024, torch.float32, fns, 1e12, timer="stream", repeat=3)
    assert seen == [{"torch", "cuteforge"}] * 3
    assert row["torch_us"] == 1000.0 and row["cuteforge_us"] == 600.0  # medians of 1.0/1.2/0.9 and 0.5/1.5/0.6 ms
    assert row["cuteforge_over_torch_reps"] == [2.0, 0.8, 1.5]
    assert row["cuteforge_over_torch"] == pytest.approx(1000.0 / 600.0, abs=0.01)  # from the medians
    monkeypatch.setattr(library_bench.timing, "stream", lambda calls, errors=None: {"torch": 1.0, "cuteforge": 0.5})
    tiny = library_bench.measure("softmax", 4, 8, torch.float32, fns, 1e12, timer="stream")
    assert "cuteforge_over_torch_reps" not in tiny
    # 256 bytes a millisecond: both GB/s fields round to 0.0; the ratio comes from the times
    assert tiny["cuteforge_GBps"] == tiny["torch_GBps"] == 0.0 and tiny["cuteforge_over_torch"] == 2.0


def test_measure_event_repeat_rotates_order_and_keeps_ratios(monkeypatch):
    """library_bench.measure with the event timer and repeat=3 (CPU, timing.bench stubbed):
    each run times every contender once, the first place rotating run by run; the times
    are medians over the runs; per-run ratios to torch and to quack are kept; a contender
    that raises in a later run is dropped with its error recorded, the others still timed."""
    import torch

    from cuteforge.bench import library as library_bench

    monkeypatch.setattr(library_bench, "inputs", lambda op, m, n, dtype: (torch.randn(m, n),))
    order: list[str] = []
    ms = {"torch": [1.0, 1.2, 0.9], "cuteforge": [0.5, 1.5, 0.6], "quack": [0.6, 1.5, 0.3], "flaky": [1.0]}

    def fake_bench(call, warmup_ms, rep_ms):
        name = call()
        order.append(name)
        if not ms[name]:
            raise RuntimeError("flaky failed")
        return ms[name].pop(0)

    monkeypatch.setattr(library_bench.timing, "bench", fake_bench)
    names = ("torch", "cuteforge", "quack", "flaky")
    fns = {k: (lambda x, k=k: k) for k in names}
    monkeypatch.setattr(library_bench, "_close", lambda *a: True)
    row = library_bench.measure("softmax", 4, 8, torch.float32, fns, 1e12, timer="event", repeat=3)
    assert order == ["torch", "cuteforge", "quack", "flaky", "cuteforge", "quack", "flaky", "torch", "quack", "torch",
                     "cuteforge"]
    assert row["torch_us"] == 1000.0 and row["cuteforge_us"] == 600.0 and row["quack_us"] == 600.0
    assert row["cuteforge_over_torch_reps"] == [2.0, 0.8, 1.5]
    assert row["cuteforge_over_quack_reps"] == [1.2, 1.0, 0.5]
    assert row["flaky_error"] == "RuntimeError: flaky failed" and "flaky_us" not in row
