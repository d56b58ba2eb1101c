"""``quantscope serve``: one-line errors before anything loads, and the real command serving until SIGINT."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from quantscope.cli.main import main


def run(capsys: Any, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "70000"], "argument --port: 70000 is out of range (0..65,535)"),
    (["--parallel", "0"], "argument -np/--parallel: 0 is out of range (1..64)"),
    (["-c", "8"], "argument -c/--ctx: 8 is out of range (16..16,777,216)"),
    (["--api-key", "a", "--api-key-file", "f"], "argument --api-key-file: not allowed with argument --api-key"),
    (["--api-key", "two words"], "the API key must be printable ASCII without spaces"),
    (["--backend", "tpu"], "argument --backend: invalid choice"),
    (["--prefill-chunk", "-1"], "argument --prefill-chunk: -1 is out of range (0..1,048,576)"),
])
def test_bad_arguments_are_one_line(capsys: Any, model_path: Any, args: list[str], message: str) -> None:
    rc, err = run(capsys, "serve", str(model_path("smollm2")), *args)
    assert rc == 2 and err.startswith("quantscope: error: ") and message in err and err.count("\n") == 1


def test_missing_model_and_empty_key_file(capsys: Any, tmp_path: Path, model_path: Any) -> None:
    rc, err = run(capsys, "serve", str(tmp_path / "none.gguf"))
    assert rc == 2 and err.startswith("quantscope: error: ") and err.count("\n") == 1
    (tmp_path / "key").write_text("\n")
    rc, err = run(capsys, "serve", str(model_path("smollm2")), "--api-key-file", str(tmp_path / "key"))
    assert rc == 2 and err == f"quantscope: error: --api-key-file: {tmp_path / 'key'} is empty\n"


def test_slot_save_path_refusals_are_one_line(capsys: Any, model_path: Any, tmp_path: Path) -> None:
    """--slot-save-path: a file where its folder should be; with several models (whose slots no request names)."""
    (tmp_path / "file").write_text("x")
    rc, err = run(capsys, "serve", str(model_path("smollm2")), "--port", "0", "-c", "64", "--no-repack",
                  "--slot-save-path", str(tmp_path / "file"))
    assert rc == 2 and err.splitlines()[-1].startswith(f"quantscope: error: --slot-save-path {tmp_path / 'file'}: "
                                                       "cannot make this folder: ")
    rc, err = run(capsys, "serve", "--models", str(model_path("smollm2")), "--port", "0",
                  "--slot-save-path", str(tmp_path / "d"))
    assert rc == 2 and "--slot-save-path is for serving one model" in err and err.count("\n") == 1


def test_a_taken_port_is_one_line(capsys: Any, model_path: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        rc, err = run(capsys, "serve", str(model_path("smollm2")), "--port", str(port), "-c", "64", "--no-repack")
    assert rc == 2 and err.splitlines()[-1].startswith(f"quantscope: error: cannot listen on 127.0.0.1:{port}: ")


def test_serve_until_interrupted(tmp_path: Path, model_path: Any) -> None:
    """The console script on a free port with a key file: /health open, the API behind the key, Ctrl-C stops it
    cleanly (exit 0, no traceback)."""
    key = tmp_path / "key.txt"
    key.write_text("s3cret\n")
    exe = os.path.join(os.path.dirname(sys.executable), "quantscope")
    proc = subprocess.Popen([exe, "serve", str(model_path("smollm2")), "--port", "0", "-c", "128", "-t", "1",
                             "--api-key-file", str(key)], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        for _ in range(20):
            line = proc.stderr.readline()
            m = re.search(r" at (http://127\.0\.0\.1:\d+)/v1 \(API key required\)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the server did not say where it listens"
        with urllib.request.urlopen(url + "/health", timeout=120) as r:
            assert json.load(r)["status"] == "ok"
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(url + "/v1/models", timeout=120)
        assert exc.value.code == 401
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(
            {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}).encode(),
            headers={"Authorization": "Bearer s3cret", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            body = json.load(r)
        assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGINT)
        _out, rest = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
