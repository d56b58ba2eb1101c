"""Issue 12, item 6: a model file truncated or replaced while it is being read.

Native kernels reading the dead mapping raise MappedFileError (the SIGBUS guard), the pool keeps working, faults
outside any guard still end the process by SIGBUS (or with one CLI error line), the CLI exits with one
``quantscope: error:`` line, and the desktop app notices the change, stops its workers and offers a reload.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.bench import random_weights
from quantscope.core.native import ffi, lib
from quantscope.core.native import kernels as K
from quantscope.core.quant import ggml_type

ISAS = K.ISA_NAMES[: K.ISA_NAMES.index(K.isa_detected()) + 1]
PAGE = mmap.PAGESIZE
ROWS, KDIM = 512, 1024  # Q8_0: 557,056 bytes, large enough for the pool's parallel paths


def _mapped_then_truncated(path: Path, data: np.ndarray, keep: int) -> np.ndarray:
    """Write ``data``, map it read-only, truncate the file to ``keep`` bytes; returns the (now half-dead) view.

    The view must not be read from Python past ``keep`` (that would be an unguarded SIGBUS)."""
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, dtype=np.uint8)
    os.truncate(path, keep)
    return view


@pytest.fixture
def q8(tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(good weights in RAM, the same bytes mapped from a file truncated to its first page)."""
    good = random_weights("Q8_0", ROWS, KDIM, seed=3)
    return good, _mapped_then_truncated(tmp_path / "w.bin", good, PAGE)


def _reference(good: np.ndarray, x: np.ndarray) -> np.ndarray:
    w = K.dequantize(good.reshape(ROWS, -1), "Q8_0", threads=1)
    return K.matmat("Q8_0", good, ROWS, KDIM, x, threads=1) if x.ndim == 2 else w @ x


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ISAS)
def test_kernels_on_truncated_mapping_raise_and_pool_survives(q8, isa: str, threads: int) -> None:
    good, dead = q8
    t = ggml_type("Q8_0")
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal(KDIM).astype(np.float32)
    x8 = rng.standard_normal((8, KDIM)).astype(np.float32)
    with K.forced_isa(isa):
        for gemm in (True, False):
            with K.prefill_gemm(gemm), pytest.raises(K.MappedFileError, match="no longer readable"):
                K.matmat(t, dead, ROWS, KDIM, x8, threads=threads)
        with pytest.raises(K.MappedFileError, match="matvec Q8_0: mapped memory is no longer readable"):
            K.matvec(t, dead, ROWS, KDIM, x1, threads=threads)
        with pytest.raises(K.MappedFileError, match="dequantize Q8_0"):
            K.dequantize(dead.reshape(ROWS, -1), t, threads=threads)
        with pytest.raises(K.MappedFileError, match="get_rows Q8_0"):
            K.get_rows(t, dead, ROWS, KDIM, np.array([0, ROWS - 1, ROWS // 2]), threads=threads)
        xq = K.quantize_activation(x1, "Q8_0")
        row_bytes = t.row_bytes(KDIM)
        with pytest.raises(K.MappedFileError, match="vec_dot"):
            K.vec_dot(t, dead[(ROWS - 1) * row_bytes:], xq, KDIM)
        assert lib.qs_guard_last_fault() == 0
        lib.qs_read_probe(ffi.from_buffer(dead), dead.size, threads)
        with pytest.raises(K.MappedFileError, match="read probe"):
            K.check_last_fault("read probe")
        # the first page is still readable: rows there work, and so does the pool on good data afterwards
        assert np.array_equal(K.get_rows(t, dead, ROWS, KDIM, np.array([0]), threads=threads),
                              K.get_rows(t, good, ROWS, KDIM, np.array([0]), threads=1))
        for _ in range(3):
            y = K.matmat(t, good, ROWS, KDIM, x8, threads=threads)
            np.testing.assert_allclose(y, _reference(good, x8), rtol=1e-5, atol=1e-4)
            np.testing.assert_array_equal(K.dequantize(good.reshape(ROWS, -1), t, threads=threads),
                                          K.dequantize(good.reshape(ROWS, -1), t, threads=1))


def test_string_scan_on_truncated_mapping(tmp_path: Path) -> None:
    n = 50_000
    one = np.frombuffer(np.uint64(20).tobytes() + b"tokentokentokentoken", dtype=np.uint8)
    data = np.tile(one, n)
    dead = _mapped_then_truncated(tmp_path / "s.bin", data, PAGE)
    buf = ffi.from_buffer(dead)
    out_end, err_pos, err_index = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    for check_utf8 in (0, 1):
        code = lib.qs_scan_strings(buf, dead.size, n, 1 << 20, check_utf8, ffi.NULL, out_end, err_pos, err_index)
        assert code == lib.QS_ERR_MAPPED_FAULT == -9
    assert lib.qs_utf8_invalid_at(buf, dead.size) == 0
    assert lib.qs_guard_last_fault() == 1
    assert lib.qs_guard_last_fault() == 0  # reading clears it
    good = ffi.from_buffer(data)
    assert lib.qs_scan_strings(good, data.size, n, 1 << 20, 1, ffi.NULL, out_end, err_pos, err_index) == 0
    assert out_end[0] == data.size


_UNGUARDED = """
import mmap, os, sys
import numpy as np
from quantscope.core.native import kernels as K
p = sys.argv[1]
open(p, "wb").write(bytes(1 << 20))
K.dequantize(np.zeros(34, np.uint8), "Q8_0")          # a guarded call: our handler is installed now
{setup}
with open(p, "rb") as f:
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
view = np.frombuffer(mm, dtype=np.uint8)
os.truncate(p, 0)
{before}
print("reading", flush=True)
print(int(view[-1]))                                   # unguarded numpy read of a dead page
print("survived", flush=True)
"""


def _run_unguarded(tmp_path: Path, setup: str = "", before: str = "",
                   flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    code = textwrap.dedent(_UNGUARDED).format(setup=setup, before=before)
    return subprocess.run([sys.executable, *flags, "-c", code, str(tmp_path / "u.bin")], capture_output=True,
                          text=True, timeout=120)


def test_unguarded_fault_still_dies_by_sigbus(tmp_path: Path) -> None:
    r = _run_unguarded(tmp_path)
    assert r.returncode == -signal.SIGBUS, r.stderr
    assert "reading" in r.stdout and "survived" not in r.stdout


def test_unguarded_fault_chains_to_faulthandler(tmp_path: Path) -> None:
    r = _run_unguarded(tmp_path, flags=("-X", "faulthandler"))
    assert r.returncode == -signal.SIGBUS, r.stderr
    assert "Fatal Python error: Bus error" in r.stderr
    assert "survived" not in r.stdout


def test_faulthandler_enabled_after_the_guard(tmp_path: Path) -> None:
    """faulthandler replacing our handler later: the next guarded call re-installs ours (the guard works), and an
    unguarded fault still reaches faulthandler and ends the process (no loop between the two handlers)."""
    before = textwrap.dedent("""
        try:
            K.dequantize(view[: 272 * 3000].reshape(-1, 272), "Q8_0", threads=2)
        except K.MappedFileError as exc:
            print("guarded:", exc, flush=True)
    """)
    r = _run_unguarded(tmp_path, setup="import faulthandler; faulthandler.enable()", before=before)
    assert r.returncode == -signal.SIGBUS, r.stderr
    assert "guarded: dequantize Q8_0: mapped memory is no longer readable" in r.stdout
    assert r.stderr.count("Fatal Python error: Bus error") == 1  # only the unguarded fault reached faulthandler
    assert "survived" not in r.stdout


def test_cli_mode_unguarded_fault_prints_one_line(tmp_path: Path) -> None:
    setup = "K.exit_on_unguarded_fault('quantscope: error: u.bin changed while it was being read (x)')"
    r = _run_unguarded(tmp_path, setup=setup)
    assert r.returncode == 2
    assert r.stderr == "quantscope: error: u.bin changed while it was being read (x)\n"


def _quantscope(*args: str, **kw) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("quantscope")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **kw)


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr
    return [ln for ln in stderr.splitlines() if ln.startswith("quantscope: error:")]


@pytest.mark.parametrize(("how", "repack"), [("truncate", False), ("replace", False), ("replace", True)])
def test_cli_generate_survives_its_model_being_truncated(model_path, tmp_path: Path, how: str, repack: bool) -> None:
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path("smollm2"), copy)
    size = copy.stat().st_size
    # --no-repack: the weights stay on the mapping; repacked, only the embedding lookups still read it
    proc = _quantscope("generate", str(copy), "-p", "Once upon a time", "-n", "100000", "--temp", "0",
                       "--ctx", "8192", "-t", "2", "--backend", "cpu", *([] if repack else ["--no-repack"]))
    try:
        assert proc.stdout is not None
        assert proc.stdout.read(20)  # tokens are streaming: the decode loop is running on the mapping
        if how == "truncate":
            os.truncate(copy, size // 2)
        else:  # rewrite in place with a shorter file: same inode, new size
            with open(copy, "r+b") as f:
                f.truncate(0)
                f.write(b"GGUF" + bytes(1000))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err.decode()
    assert proc.returncode == 2, (proc.returncode, err)
    lines = _error_lines(err)
    assert len(lines) == 1, err
    assert re.fullmatch(rf"quantscope: error: {re.escape(str(copy))} changed while it was being read "
                        r"\((transformer block|get_rows \w+|matmul): mapped memory is no longer readable: "
                        r"the file changed or was truncated\)", lines[0]), err


def test_analysis_reads_of_a_truncated_file_raise(model_path, tmp_path: Path) -> None:
    from quantscope.core import analysis
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.quant import scales

    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path("smollm2"), copy)
    f = GGUFFile(copy)
    last = max(f.tensors, key=lambda t: t.offset)
    os.truncate(copy, copy.stat().st_size // 2)
    with pytest.raises(K.MappedFileError, match="no longer readable"):
        scales.scan_scales(f)
    with pytest.raises(K.MappedFileError, match=f"{last.type.name}|{last.name}"):
        analysis.dequantize_rows(f, last, 0, last.n_rows, threads=2)
    with pytest.raises(K.MappedFileError):
        analysis.analyze_tensor(f, last)


# ---------------------------------------------------------------------------------------------- the desktop app
from .gui_helpers import hold_model, wait_idle, window  # noqa: E402, F401


def _responsive(qtbot) -> None:
    """The event loop runs: a zero-delay timer fires (the bound is a hang guard)."""
    from PySide6.QtCore import QTimer

    fired: list[bool] = []
    QTimer.singleShot(0, lambda: fired.append(True))
    qtbot.waitUntil(lambda: bool(fired), timeout=60000)


@pytest.mark.parametrize("how", ["truncate", "replace"])
def test_gui_notices_the_change_stops_workers_and_reloads(window, qtbot, model_path, tmp_path, how):  # noqa: F811
    import threading

    from quantscope.core import analysis

    src = model_path("smollm2")
    copy = tmp_path / "model.gguf"
    shutil.copyfile(src, copy)
    assert window.open_path(copy)
    wait_idle(qtbot, window)
    f = window.doc.gguf
    started = threading.Event()
    outcome: list[str] = []

    def reader(report, token):  # a worker reading the mapping until told to stop
        big = sorted(f.tensors, key=lambda t: -t.n_bytes)[:4]
        while not token.cancelled:
            for t in big:
                analysis.dequantize_rows(f, t, 0, t.n_rows, threads=2)
            started.set()

    window.runner.start("reader", reader, on_failed=lambda m, _tb: outcome.append(m),
                        on_cancelled=lambda: outcome.append("cancelled"))
    assert started.wait(120)
    if how == "truncate":
        os.truncate(copy, copy.stat().st_size // 2)
        want = "its size went from"
    else:
        other = tmp_path / "other.gguf"
        shutil.copyfile(src, other)
        os.replace(other, copy)
        want = "it was replaced by another file"
    # (the reader sees the cancel between two rounds over the four largest tensors: seconds on a loaded machine)
    qtbot.waitUntil(lambda: window.stale_bar.isVisible(), timeout=120000)
    assert all(t.done for t in window.runner.running()) and window.doc is None  # ended before the notice showed
    qtbot.waitUntil(lambda: not window.runner.running(), timeout=60000)
    qtbot.waitUntil(lambda: bool(outcome), timeout=60000)
    assert outcome[0] == "cancelled" or "mapped memory is no longer readable" in outcome[0]
    assert want in window.stale_label.text() and "model.gguf changed on disk" in window.stale_label.text()
    assert "(changed on disk)" in window.windowTitle()
    assert window.chat_view.host.threads_alive() == 0
    _responsive(qtbot)
    window.show_about().close()
    # Reload re-opens it (restored to a whole model)
    shutil.copyfile(src, copy)
    window.stale_reload.click()
    assert window.doc is not None and window.doc.stale is None and not window.stale_bar.isVisible()
    assert window.current_view() == "overview" and window.windowTitle() == "model.gguf — Quantscope"
    wait_idle(qtbot, window)
    # and Close dismisses a second notice
    os.truncate(copy, 1000)
    assert window.check_file() is not None and window.stale_bar.isVisible()
    window.stale_close.click()
    assert not window.stale_bar.isVisible() and window.doc is None and window.current_view() == "welcome"


def test_gui_chat_thread_survives_truncation_mid_reply(window, qtbot, model_path, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("QUANTSCOPE_DATA", str(tmp_path / "qs-data"))
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path("smollm2"), copy)
    assert window.open_path(copy)
    window.show_view("chat")
    chat = window.chat_view
    with qtbot.waitSignal(chat.engineLoaded, timeout=120_000):
        assert chat.load_model()
    chat.apply_preset("Greedy")
    chat.max_spin.setValue(2000)
    window.file_timer.stop()  # let the model thread meet the dead mapping first
    failed: list[str] = []
    chat.replyFailed.connect(failed.append)
    # the model thread is held after its third token while the file is cut: it meets the dead mapping mid-reply
    with hold_model(chat.host._worker, "delta", lambda _r, _t, st: st.n_generated >= 3) as held:
        assert chat.send("Tell me a very long story about a dragon.")
        qtbot.waitUntil(held.is_set, timeout=120_000)
        assert chat.host.state == "generating"
        os.truncate(copy, copy.stat().st_size // 2)
        held.release.set()
        qtbot.waitUntil(lambda: window.stale_bar.isVisible(), timeout=120000)
    assert window.doc is None and chat.host.threads_alive() == 0 and chat.host.state == "empty"
    assert not failed or "no longer readable" in failed[0] or "changed" in failed[0]
    _responsive(qtbot)


def test_gui_block_inspector_checks_before_reading(window, qtbot, model_path, tmp_path):  # noqa: F811
    """Watchers miss some changes: the block inspector itself asks before reading a block of the mapping."""
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path("smollm2"), copy)
    assert window.open_path(copy)
    wait_idle(qtbot, window)
    f = window.doc.gguf
    last = max((t for t in f.tensors if t.n_rows > 1), key=lambda t: t.offset)
    assert last.offset > f.file_size // 2
    window.inspect_block(last.name, 0, 0, 0)
    assert window.current_view() == "block" and window.block_view.decoded is not None
    window.file_timer.stop()
    window.file_watcher.removePaths(window.file_watcher.files())  # as if the watcher missed it
    os.truncate(copy, copy.stat().st_size // 2)
    window.block_view.row_spin.setValue(last.n_rows - 1)  # would read a page past the new end
    assert window.stale_bar.isVisible() and window.doc is None
    _responsive(qtbot)


def _truncate_while_running(proc: subprocess.Popen, copy: Path, ready) -> str:
    """Wait for ``ready(proc)`` (the command is reading the model), truncate the model to half; returns stderr."""
    try:
        ready(proc)
        os.truncate(copy, copy.stat().st_size // 2)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err.decode()


def _stderr_line_starting(prefix: str):
    def ready(proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in iter(proc.stderr.readline, b""):
            if line.decode().startswith(prefix):
                return
        pytest.fail(f"the command ended before printing {prefix!r}")
    return ready


# These run with --no-repack: a repacked engine holds its matrices in memory and no longer reads them from the
# file (only the embedding lookup still does), so the mapped path is the one a change under it can reach.
@pytest.mark.parametrize("command", ["chat", "perplexity", "bench"])
def test_cli_commands_end_with_one_error_line(model_path, tmp_path: Path, command: str) -> None:
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path("smollm2"), copy)
    if command == "chat":
        proc = _quantscope("chat", str(copy), "-n", "100000", "--temp", "0", "-t", "2", "--backend", "cpu",
                           "--no-repack", stdin=subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(b"Tell me a very long story about a dragon.\n")
        proc.stdin.flush()
        ready = lambda p: p.stdout.read(10)  # noqa: E731  # the reply is streaming
    elif command == "perplexity":
        text = tmp_path / "text.txt"
        text.write_text((Path(__file__).parent / "data" / "english.txt").read_text(encoding="utf-8") * 60)
        proc = _quantscope("perplexity", str(copy), "-f", str(text), "-c", "128", "-t", "2", "--backend", "cpu",
                           "--no-repack")
        ready = _stderr_line_starting("[1/")
    else:
        proc = _quantscope("bench", str(copy), "-p", "64", "-n", "100000", "-t", "2", "--no-repack")
        ready = _stderr_line_starting("bench: tg")  # loaded, prefill done, decoding
    err = _truncate_while_running(proc, copy, ready)
    assert proc.returncode == 2, (proc.returncode, err)
    lines = _error_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"quantscope: error: {copy} changed while it was being read ("), err


def test_vocabulary_read_of_a_truncated_file_raises(model_path, tmp_path: Path) -> None:
    """The tokenizer reads every token string at once: one guarded copy, so a truncated file is an error."""
    from quantscope.core.gguf import GGUFFile

    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path("smollm2"), copy)
    f = GGUFFile(copy)
    tokens = f.get("tokenizer.ggml.tokens")
    whole = list(tokens)
    assert len(whole) == 49152 and whole[:2] == [tokens[0], tokens[1]]
    os.truncate(copy, 4096)  # the vocabulary lies past the first page
    with pytest.raises(K.MappedFileError, match="string array"):
        list(tokens)
