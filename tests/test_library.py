"""The library (core/library.py, `quantscope models list --local`): every GGUF in the stores the usual tools keep,
built here in their real layouts (the Hugging Face cache's blobs, snapshots and refs, which huggingface_hub's own
scan reads; Ollama's manifests and blobs; LM Studio's and llama.cpp's folders), read from headers only, with
incremental rescans and hostile stores."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantscope.core import library as lib
from quantscope.core.gguf.reader import GGUFFile
from quantscope.core.gguf.split import plan_split, write_plan

from .arch_fixtures import vocabulary, write_fixture

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    """A real model file (the llama architecture fixture)."""
    return write_fixture("llama", tmp_path_factory.mktemp("lib") / "llama.gguf", vocab=vocabulary())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hf_cache(root: Path, repo: str, files: dict[str, Path], commit: str = "a" * 40) -> None:
    """``files`` into a Hugging Face cache at ``root`` as huggingface_hub lays it out: blobs by hash, the snapshot's
    files as relative links to them, refs/main naming the commit."""
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    for rel, src in files.items():
        blob = base / "blobs" / _sha(src)
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, blob)
        link = base / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


def ollama_store(root: Path, name: str, tag: str, src: Path, host: str = "registry.ollama.ai",
                 namespace: str = "library") -> Path:
    digest = _sha(src)
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, blob)
    manifest = root / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": src.stat().st_size},
    ]}))
    return blob


@pytest.fixture
def home(tmp_path, monkeypatch, gguf) -> Path:
    """A home folder with every store filled, and the environment pointing at it."""
    h = tmp_path / "home"
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("USERPROFILE", str(h))
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "OLLAMA_MODELS", "LLAMA_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(h / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(h / ".local" / "share"))
    # a 3-shard set in the HF cache, and one single file
    split_dir = tmp_path / "split"
    split_dir.mkdir()
    with GGUFFile(gguf) as f:
        plan = plan_split(f, split_dir / "llama", max_tensors=8)
        write_plan(f, plan)
    shards = sorted(split_dir.glob("llama-*-of-*.gguf"))
    assert len(shards) >= 3
    hf_cache(h / ".cache" / "huggingface" / "hub", "org/Tiny-GGUF",
             {"tiny.Q8_0.gguf": gguf, "README.md": ROOT / "README.md",
              **{f"split/{p.name}": p for p in shards}})
    ollama_store(h / ".ollama" / "models", "tiny", "latest", gguf)
    lm = h / ".lmstudio" / "models" / "publisher" / "Tiny-GGUF"
    lm.mkdir(parents=True)
    shutil.copyfile(gguf, lm / "tiny.gguf")
    (lm / "notes.txt").write_text("not a model")
    cpp = h / ".cache" / "llama.cpp"
    cpp.mkdir(parents=True)
    shutil.copyfile(gguf, cpp / "org_Tiny-GGUF_tiny.gguf")
    return h


def test_every_store_is_found_and_read_from_headers(home, gguf, tmp_path):
    rows = lib.scan(cache=tmp_path / "scan.json")
    by = {(e.source, e.name): e for e in rows}
    assert set(by) == {("hf", "org/Tiny-GGUF/tiny.Q8_0.gguf"), ("hf", f"org/Tiny-GGUF/split/{_first(home)}"),
                       ("lmstudio", "publisher/Tiny-GGUF/tiny.gguf"), ("ollama", "tiny:latest"),
                       ("llama.cpp", "org_Tiny-GGUF_tiny.gguf")}
    with GGUFFile(gguf) as f:
        params = sum(t.n_elements for t in f.tensors)
    for e in rows:
        assert e.architecture == "llama" and e.parameters == params and e.problem is None, e
        assert e.file_type == "F32"
    split = by[("hf", f"org/Tiny-GGUF/split/{_first(home)}")]
    assert split.shards >= 3 and split.size > gguf.stat().st_size  # every shard counted (headers repeat)
    single = by[("ollama", "tiny:latest")]
    assert single.shards == 1 and single.size == gguf.stat().st_size
    assert Path(single.path).parent.name == "blobs"  # opened in place, nothing copied
    assert Path(by[("hf", "org/Tiny-GGUF/tiny.Q8_0.gguf")].path).is_symlink()  # the snapshot's link


def _first(home: Path) -> str:
    snap = next((home / ".cache" / "huggingface" / "hub").glob("models--*/snapshots/*/split"))
    return next(p.name for p in sorted(snap.iterdir()) if "-00001-of-" in p.name)


def test_a_rescan_reads_only_what_changed(home, tmp_path, monkeypatch):
    cache = tmp_path / "scan.json"
    first = lib.scan(cache=cache)
    read: list[str] = []
    real = lib.read_entry

    def counting(c: lib.Candidate) -> lib.Entry:
        read.append(c.name)
        return real(c)

    monkeypatch.setattr(lib, "read_entry", counting)  # counts the header reads; the reads are the real ones
    again = lib.scan(cache=cache)
    assert read == [] and [e.to_json() for e in again] == [e.to_json() for e in first]
    target = home / ".lmstudio" / "models" / "publisher" / "Tiny-GGUF" / "tiny.gguf"
    data = bytearray(target.read_bytes())
    target.write_bytes(bytes(data[: len(data) // 2]))  # truncated: a changed file, now unreadable
    third = lib.scan(cache=cache)
    assert read == ["publisher/Tiny-GGUF/tiny.gguf"]
    bad = next(e for e in third if e.source == "lmstudio")
    assert "truncated" in bad.problem and bad.architecture == "llama"  # the header read, and what is wrong


def test_environment_overrides(tmp_path, monkeypatch):
    env = {"HF_HUB_CACHE": str(tmp_path / "hf"), "OLLAMA_MODELS": str(tmp_path / "ol"),
           "LLAMA_CACHE": str(tmp_path / "cpp")}
    places = {s.kind: s.root for s in lib.store_places(env)}
    assert places["hf"] == tmp_path / "hf" and places["ollama"] == tmp_path / "ol"
    assert places["llama.cpp"] == tmp_path / "cpp"
    assert {s.root for s in lib.store_places({"HF_HOME": str(tmp_path / "h")}) if s.kind == "hf"} == {
        tmp_path / "h" / "hub"}
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xc"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xd"))
    plain = {(s.kind, s.root) for s in lib.store_places({})}  # Linux: the XDG folders
    assert ("hf", tmp_path / "xc" / "huggingface" / "hub") in plain
    assert ("llama.cpp", tmp_path / "xc" / "llama.cpp") in plain
    assert ("gpt4all", tmp_path / "xd" / "nomic.ai" / "GPT4All") in plain
    assert ("lmstudio", tmp_path / "home" / ".lmstudio" / "models") in plain


def test_hostile_stores_are_listed_safely(tmp_path, gguf):
    ol = tmp_path / "ol"
    ollama_store(ol, "tiny", "latest", gguf)
    bad = ol / "manifests" / "registry.ollama.ai" / "library"
    (bad / "evil").mkdir()
    (bad / "evil" / "latest").write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../../../etc/passwd"}]}))
    (bad / "junk").mkdir()
    (bad / "junk" / "latest").write_bytes(b"\xff\xfe not json")
    (bad / "big").mkdir()
    (bad / "big" / "latest").write_bytes(b"{" + b" " * (lib.MAX_MANIFEST_BYTES + 1))
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "zero.gguf").write_bytes(b"")
    (folder / "text.gguf").write_text("GGUF? no")
    (folder / "loop").symlink_to(folder)  # not followed
    rows = lib.scan([lib.Store("ollama", ol), lib.Store("folder", folder)], cache=tmp_path / "c.json")
    assert [e.name for e in rows if e.source == "ollama"] == ["tiny:latest"]
    bad_rows = {e.name: e for e in rows if e.source == "folder"}
    assert set(bad_rows) == {"text.gguf", "zero.gguf"}
    assert all(e.problem and e.architecture is None for e in bad_rows.values())


def test_the_cli_lists_adds_and_removes_folders(home, gguf, tmp_path):
    env = {**os.environ}
    extra = tmp_path / "mine"
    (extra / "deep").mkdir(parents=True)
    shutil.copyfile(gguf, extra / "deep" / "mine.gguf")
    run = [sys.executable, "-m", "quantscope.cli", "models"]
    out = subprocess.run([*run, "add-folder", str(extra)], env=env, capture_output=True, text=True, check=True)
    assert "added" in out.stdout
    js = subprocess.run([*run, "list", "--local", "--json"], env=env, capture_output=True, text=True, check=True)
    data = json.loads(js.stdout)
    names = {(m["source"], m["name"]) for m in data["models"]}
    assert ("folder", "deep/mine.gguf") in names and ("ollama", "tiny:latest") in names
    table = subprocess.run([*run, "list", "--local"], env=env, capture_output=True, text=True, check=True).stdout
    assert "tiny:latest" in table and "llama" in table and table.strip().splitlines()[-1].startswith("6 models in")
    subprocess.run([*run, "remove-folder", str(extra)], env=env, capture_output=True, text=True, check=True)
    gone = subprocess.run([*run, "remove-folder", str(extra)], env=env, capture_output=True, text=True)
    assert gone.returncode != 0 and gone.stderr.startswith("quantscope: error:") and "Traceback" not in gone.stderr
    nope = subprocess.run([*run, "add-folder", str(tmp_path / "absent")], env=env, capture_output=True, text=True)
    assert nope.returncode != 0 and "not a folder" in nope.stderr and len(nope.stderr.strip().splitlines()) == 1
