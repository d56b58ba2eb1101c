"""``quantscope embed`` and ``quantscope serve`` of an embedding model: the BERT fixture's vectors as text, JSON and
.npy (the encoder's, which tests/test_bert.py holds to llama-embedding's), one-line errors, and the real command
serving /v1/embeddings until SIGINT."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine.encoder import Encoder

from .arch_fixtures import write_fixture as write_arch
from .bert_fixtures import write_fixture

TEXTS = ["The quick brown fox.", "hello world"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_fixture("bert-mean", tmp_path_factory.mktemp("embcli") / "bge-tiny.gguf")


@pytest.fixture(scope="module")
def want(model: Path) -> list[np.ndarray]:
    with Encoder(model) as enc:
        return enc.embed(TEXTS)


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_text_and_npy(capsys, model, want, tmp_path):
    rc, out, _ = run(capsys, "embed", str(model), "-p", *TEXTS, "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["pooling"] == "mean" and [x["index"] for x in d["data"]] == [0, 1]
    for x, w in zip(d["data"], want, strict=True):
        assert np.allclose(x["embedding"], w, atol=1e-7)
    rc, out, _ = run(capsys, "embed", str(model), "-p", *TEXTS)
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith("embedding 0 (") and lines[2].startswith("embedding 1 (")
    assert np.allclose([float(x) for x in lines[3].split()], want[1], atol=1e-6)
    texts = tmp_path / "texts.txt"
    texts.write_text(TEXTS[0] + "\n\n" + TEXTS[1] + "\n")
    npy = tmp_path / "v.npy"
    assert run(capsys, "embed", str(model), "-f", str(texts), "--npy", str(npy))[0] == 0
    arr = np.load(npy)
    assert arr.shape == (2, 64) and arr.dtype == np.float32 and np.allclose(arr, np.stack(want), atol=1e-7)
    assert run(capsys, "embed", str(model), "-p", "hello", "--pooling", "none", "--npy", str(npy))[0] == 0
    assert np.load(npy).shape == (3, 64)  # [CLS] hello [SEP]
    rc, out, _ = run(capsys, "embed", str(model), "-p", "hello", "--pooling", "cls", "--normalize", "-1", "--json")
    with Encoder(model) as enc:
        assert np.allclose(json.loads(out)["data"][0]["embedding"], enc.embed(["hello"], "cls", -1)[0], atol=1e-7)


@pytest.mark.parametrize(("args", "message"), [
    ([], "give the texts: -p TEXT"),
    (["-p", "x", "-f", "y"], "with -p or with -f, not both"),
    (["-p", "word " * 300], "text 1 has 302 tokens but the model's positions hold 128"),
    (["-p", "x", "--pooling", "max"], "argument --pooling: invalid choice"),
    (["-p", "x", "--json", "--npy", "a.npy"], "not allowed with argument --json"),
])
def test_errors_are_one_line(capsys, model, args, message):
    rc, _, err = run(capsys, "embed", str(model), *args)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_a_generative_model_and_missing_files_are_one_line(capsys, tmp_path):
    llama = write_arch("llama", tmp_path / "llama.gguf")
    rc, _, err = run(capsys, "embed", str(llama), "-p", "x")
    assert rc == 2 and "text generation model, not an embedding model" in err and err.count("\n") == 1
    rc, _, err = run(capsys, "embed", str(tmp_path / "none.gguf"), "-p", "x")
    assert rc == 2 and err.count("\n") == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    rc, _, err = run(capsys, "embed", str(llama), "-f", str(empty))
    assert rc == 2 and "no non-empty line" in err


def test_serve_an_embedding_model_until_interrupted(model, want):
    exe = os.path.join(os.path.dirname(sys.executable), "quantscope")
    proc = subprocess.Popen([exe, "serve", str(model), "--port", "0", "--api-key", "k3y"], stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        url = None
        for _ in range(20):
            line = proc.stderr.readline()
            m = re.search(r"embedding model, mean pooling, 64 dimensions\) at (http://127\.0\.0\.1:\d+)/v1/embeddings",
                          line)
            if m:
                url = m.group(1)
                break
        assert url, "the server did not say where it listens"
        body = json.dumps({"input": TEXTS}).encode()
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(urllib.request.Request(url + "/v1/embeddings", data=body), timeout=120)
        assert exc.value.code == 401
        req = urllib.request.Request(url + "/v1/embeddings", data=body, headers={
            "Authorization": "Bearer k3y", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            got = json.load(r)
        assert np.allclose([d["embedding"] for d in got["data"]], np.stack(want), atol=1e-6)
    finally:
        proc.send_signal(signal.SIGINT)
        _out, rest = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest


def test_serve_pooling_is_for_embedding_models(capsys, tmp_path):
    llama = write_arch("llama", tmp_path / "llama.gguf")
    rc, _, err = run(capsys, "serve", str(llama), "--port", "0", "--pooling", "mean")
    assert rc == 2 and "--pooling is for embedding models" in err


def test_serve_an_embedding_model_on_the_gpu_is_one_line(capsys, model):
    rc, _, err = run(capsys, "serve", str(model), "--port", "0", "--backend", "cuda")
    assert rc == 2 and "embedding models run on the CPU" in err and err.count("\n") == 1
