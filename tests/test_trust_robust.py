"""A cache that cannot be written, a stopped lock holder, an unstorable tuning sweep,
bad parameters, and arbitrary bytes in any cache or tuning file: calls keep working.

Read-only directories need a process that permissions bind (root's capabilities override
them): as root the check runs in a subprocess without those capabilities. Read-only, full and inode-starved file systems
are tiny tmpfs mounts, skipped where mounting is not allowed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trust_stand_in import ARCH, IS_ROOT, KERNEL, get

import cuteforge
from cuteforge import Signature, TensorArg, cache, compiler, trust
from cuteforge.cache import DEFAULT_CACHE, entry_for
from cuteforge.signature import BoundKey

SRC = Path(__file__).resolve().parent.parent / "src"
pytestmark = pytest.mark.usefixtures("fresh_warnings")  # conftest.py


# --- file systems and directories that cannot be written -----------------------------------


@contextlib.contextmanager
def tmpfs(options: str) -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="cuteforge-tmpfs-"))
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here")
        os.chmod(where, 0o700)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        os.rmdir(where)


def _fill(d: Path) -> None:
    """Use up a file system's inodes or bytes."""
    with contextlib.suppress(OSError):
        for i in range(100000):
            (d / f"f{i}").write_bytes(b"x" * 4096)


def _compiles_in_memory_with_one_warning(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(root))
    a, b = get(f"a-{uuid.uuid4()}"), get(f"b-{uuid.uuid4()}")
    assert a[1] == b[1] == 1 and a[0].startswith(b"a-") and b[0].startswith(b"b-")
    assert len(a[2]) == 1 and not b[2] and "cannot be used" in a[2][0], (a[2], b[2])


def test_out_of_inodes_compiles_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    with tmpfs("size=4m,nr_inodes=64") as fs:
        root = fs / "cache"
        trust.check_root(root)
        _fill(root)
        _compiles_in_memory_with_one_warning(monkeypatch, root)


def test_full_disk_compiles_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    with tmpfs("size=256k") as fs:
        root = fs / "cache"
        _fill(trust.private_dir(root, *cache.entry_parts(KERNEL, ARCH)))
        _compiles_in_memory_with_one_warning(monkeypatch, root)
        assert not list(root.rglob("*.o"))


def test_read_only_file_system_compiles_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    with tmpfs("size=1m") as fs:
        root = fs / "cache"
        trust.check_root(root)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        _compiles_in_memory_with_one_warning(monkeypatch, root)


def test_lock_path_that_is_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(root))
    e = entry_for(trust.check_root(root), kernel=KERNEL, key_repr="k", arch=ARCH)
    e.lock.parent.mkdir(parents=True)
    e.lock.mkdir()
    out, compiles, warned = get("k")
    assert out == b"k" and compiles == 1 and len(warned) == 1 and "cannot be used" in warned[0]


CHILD = """
import json, os, sys, warnings
from cuteforge import cache, compiler, trust
if sys.argv[1:] == ["locks"]:  # lock files this process cannot open (mode 000)
    for i in range(2):
        lock = cache.entry_for(trust.check_root(cache.cache_root()), kernel="k", key_repr=f"key{i}", arch="sm_90a").lock
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text("")
        os.chmod(lock, 0)
n = []
def compile_fn(keep):
    n.append(1)
    return compiler.CompileResult(b"obj", None, None, None)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outs = [cache.DEFAULT_CACHE.get_bytes(kernel="k", key_repr=f"key{i}", arch="sm_90a", compile_fn=compile_fn) for i in range(2)]
print(json.dumps({"ok": outs == [b"obj", b"obj"], "compiles": len(n), "warnings": [str(w.message) for w in caught]}))
"""


def run_unprivileged(root: Path, *args: str) -> dict:
    """CHILD in a process that permissions bind: as root, one without the capabilities
    that override them (setpriv), else this user's."""
    cmd = [sys.executable, "-c", CHILD, *args]
    if IS_ROOT:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to run without root's permission overrides")
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", *cmd]
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(root), CUTEFORGE_LOCK_TIMEOUT="5", PYTHONPATH=str(SRC))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_read_only_directory_compiles_in_memory(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o500)
    r = run_unprivileged(root)
    assert r["ok"] and r["compiles"] == 2 and len(r["warnings"]) == 1 and "cannot be used" in r["warnings"][0], r


def test_lock_file_that_cannot_be_opened(tmp_path: Path) -> None:
    r = run_unprivileged(tmp_path / "cache", "locks")
    assert r["ok"] and r["compiles"] == 2 and len(r["warnings"]) == 1 and "cannot be used" in r["warnings"][0], r


# --- a stopped lock holder -------------------------------------------------------------------


def test_stopped_lock_holder_delays_by_the_timeout_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(root))
    monkeypatch.setenv("CUTEFORGE_LOCK_TIMEOUT", "1")
    e = entry_for(trust.private_dir(root), kernel=KERNEL, key_repr="held", arch=ARCH)
    e.lock.parent.mkdir(parents=True, mode=0o700)
    code = (f"import os, signal\nfrom filelock import FileLock\nlock = FileLock({str(e.lock)!r})\nlock.acquire()\n"
            "print('held', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done: list = []
        t0 = time.perf_counter()
        worker = threading.Thread(target=lambda: done.append(get("held")), daemon=True)
        worker.start()
        worker.join(30)
        assert done, "a stopped lock holder blocked the call"
        out, compiles, warned = done[0]
        assert out == b"held" and compiles == 1 and time.perf_counter() - t0 < 20
        assert any("waited" in w for w in warned) and not e.obj.exists()  # no second writer
    finally:
        holder.kill()
        holder.wait()
    assert get("held")[:2] == (b"held", 1) and e.obj.exists()  # lock free again: written


# --- threads and killed writers -----------------------------------------------------------


def test_eight_threads_compile_a_key_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "cache"))
    start = threading.Barrier(8)
    compiles: list[int] = []
    served: list[bytes] = []

    def compile_fn(keep: bool) -> compiler.CompileResult:
        compiles.append(1)
        time.sleep(0.2)  # long enough for every other thread to miss and wait
        return compiler.CompileResult(b"shared", None, None, None)

    def call() -> None:
        start.wait()
        served.append(DEFAULT_CACHE.get_bytes(kernel=KERNEL, key_repr="threads", arch=ARCH, compile_fn=compile_fn))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert served == [b"shared"] * 8 and compiles == [1]


KILLED = """
import sys, time
from pathlib import Path
from cuteforge import cache, compiler, trust
point = sys.argv[1]
real_write = trust.atomic_write
def stall(path, data):
    if point == "meta":  # the metadata written, the object not yet in place
        real_write(path, data)
    print("writing", flush=True)
    time.sleep(60)
def half(result, path):  # half the object in its temporary file
    Path(path).write_bytes(result.compiled[: len(result.compiled) // 2])
    print("writing", flush=True)
    time.sleep(60)
if point == "object":
    cache._BYTES = cache._Codec(half, cache._BYTES.load, cache._BYTES.fresh, cache._BYTES.from_bytes)
else:
    trust.atomic_write = stall
cache.DEFAULT_CACHE._get("k", "killed", "sm_90a", lambda keep: compiler.CompileResult(b"0123456789" * 100, None, None, None),
                         "", None, cache._BYTES)
"""


@pytest.mark.parametrize("point", ["object", "meta"])
def test_writer_killed_mid_write_leaves_no_torn_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(root))
    env = dict(os.environ, PYTHONPATH=str(SRC))
    child = subprocess.Popen([sys.executable, "-c", KILLED, point], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
    finally:
        child.kill()
        child.wait()
    calls = []

    def compile_fn(keep: bool) -> compiler.CompileResult:
        calls.append(1)
        return compiler.CompileResult(b"0123456789" * 100, None, None, None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = DEFAULT_CACHE.get_bytes(kernel="k", key_repr="killed", arch=ARCH, compile_fn=compile_fn)
        assert out == b"0123456789" * 100 and calls == [1]
        assert DEFAULT_CACHE.get_bytes(kernel="k", key_repr="killed", arch=ARCH, compile_fn=compile_fn) == out and calls == [1]


# --- a tuning sweep that cannot be stored ----------------------------------------------------


@dataclass(frozen=True)
class TrustProbeConfig:
    threads: int = 128


@cuteforge.kernel(
    name="trust_probe",
    signature=Signature(TensorArg("x", ("M",)), TensorArg("y", ("M",), dtype_like="x")),
    default_config=lambda spec: TrustProbeConfig(),
    configs=lambda spec: [TrustProbeConfig(128), TrustProbeConfig(256)],
)
def trust_probe(spec: cuteforge.CompileSpec):
    from kernels_for_tests import scale_jit

    return scale_jit(spec.config.threads, 2.0)


PROBE_KEY = BoundKey(("float32", "float32"), (), (4, 4))


def test_unstorable_sweep_is_kept_reported_and_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from cuteforge.autotune import TuneStore, lookup, tune

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    st = TuneStore(blocker / "store")  # below a regular file: cannot be created
    times = {TrustProbeConfig(128): 2.0, TrustProbeConfig(256): 1.0}
    with pytest.warns(RuntimeWarning, match="could not store tuning results"):
        res = tune(trust_probe, None, key=PROBE_KEY, dims={"M": 4096}, timer=lambda c, fn, inputs: times[c], workers=0,
                   store=st, rounds=2, keep_default=0.0)
    assert res.best_config == TrustProbeConfig(256) and res.path is None
    assert any("not stored" in r.getMessage() and "TrustProbeConfig(threads=256)" in r.getMessage() for r in caplog.records)
    assert lookup(trust_probe, PROBE_KEY, None, {"M": 4096}, store=st) == TrustProbeConfig(256)


# --- parameters ------------------------------------------------------------------------------


def test_parameters_accept_numpy_scalars_and_name_bad_ones() -> None:
    import numpy as np
    from kernels_for_tests import scale

    k = scale.key_params((("factor", np.float32(2.0)), ("n", np.int64(3)), ("t", (np.int32(1), 2))))
    assert k == (("factor", 2.0), ("n", 3), ("t", (1, 2))) and type(k[0][1]) is float and type(k[2][1][0]) is int
    with pytest.raises(TypeError, match="parameter 'factor' is a list"):
        scale.get(PROBE_KEY, (("factor", [1, 2]),))
    with pytest.raises(ValueError, match="parameter 'factor' is NaN"):
        scale.get(PROBE_KEY, (("factor", float("nan")),))


def test_parameters_of_a_call_are_checked_by_name() -> None:
    import torch
    from kernels_for_tests import scale

    x = torch.zeros(8)
    with pytest.raises(TypeError, match="parameter 'factor' is a list"):
        scale(x, x, factor=[2.0])
    with pytest.raises(ValueError, match="parameter 'factor' is NaN"):
        scale(x, x, factor=float("nan"))


def test_bind_reports_the_real_problem_before_the_device() -> None:
    import torch

    sig = Signature(TensorArg("x", ("M",)), TensorArg("y", ("M",), dtype_like="x"))
    with pytest.raises(TypeError, match="dtype int32"):
        sig.bind((torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)), "k")
    with pytest.raises(ValueError, match="M=5"):
        sig.bind((torch.zeros(4), torch.zeros(5)), "k")
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        sig.bind((torch.zeros(4), torch.zeros(4)), "k")


# --- arbitrary bytes in any cache or tuning file ------------------------------------------


FILES = ("object", "metadata", "lock", "record", "stats", "source")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(FILES), data=st.one_of(st.binary(max_size=600), st.text(max_size=300).map(str.encode),
                                                    st.just(b'{"identity": {}, "times_ms": [], "best_config": "x"}')))
def test_arbitrary_bytes_in_any_file_never_break_a_call(which: str, data: bytes) -> None:
    from cuteforge.autotune import TuneStore, lookup, make_problem
    from cuteforge.templates import codecache

    root = Path(tempfile.mkdtemp(prefix="cuteforge-prop-"))
    old = os.environ.get("CUTEFORGE_CACHE_DIR")
    os.environ["CUTEFORGE_CACHE_DIR"] = str(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            key = f"prop-{uuid.uuid4()}"
            get(key)
            e = entry_for(trust.check_root(root), kernel=KERNEL, key_repr=key, arch=ARCH)
            problem = make_problem(trust_probe, PROBE_KEY, (), {"M": 64}, ARCH)
            store = TuneStore()
            record = store.save(trust_probe, problem, {TrustProbeConfig(256): 1.0}, {}, TrustProbeConfig(256))
            assert record is not None
            cache.STATS.compiles += 1
            cache._save_stats()
            text = f"VALUE = {key!r}\n"
            h, source = codecache.write(text)
            target = {"object": e.obj, "metadata": e.meta, "lock": e.lock, "record": record, "stats": root / "stats.json", "source": source}[which]
            target.write_bytes(data)

            assert get(key)[0] == key.encode()
            assert lookup(trust_probe, PROBE_KEY, None, {"M": 64}, arch=ARCH, store=store) in (None, TrustProbeConfig(256))
            assert set(cache.cumulative_stats()) == set(cache.CacheStats().as_dict())
            cache._save_stats()
            assert codecache.write(text)[0] == h and codecache.load(h).VALUE == key
    finally:
        if old is None:
            os.environ.pop("CUTEFORGE_CACHE_DIR", None)
        else:
            os.environ["CUTEFORGE_CACHE_DIR"] = old
        subprocess.run(["rm", "-rf", str(root)])
