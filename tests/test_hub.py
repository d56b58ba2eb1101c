"""The hub verbs (pull, hub search/files, inspect hf://) against a hub that runs here (tests/hubserver.py): the real
``huggingface_hub`` client in a ``quantscope`` subprocess, pointed at the server by HF_ENDPOINT, with HF_HOME in the
test's folder. Nothing is mocked and nothing is timed: the knobs (cut, corrupt, stall) are byte counts."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from quantscope.core import hub as core_hub
from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf.split import plan_split, write_plan
from quantscope.core.model.memory import memory_plan

from .arch_fixtures import write_fixture
from .hubserver import HubServer

MiB = 1 << 20
CLI = [sys.executable, "-m", "quantscope.cli"]


def _big(path: Path, mib: int = 12, note: str = "") -> Path:
    """A GGUF of about ``mib`` MiB (one F32 matrix), larger than the client's 10 MiB read chunk and our 1 MiB
    first peek; ``note`` adds a long metadata string (a header that goes on past the first peek)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for key, v in (("context_length", 256), ("embedding_length", 64), ("block_count", 1),
                   ("attention.head_count", 4), ("attention.head_count_kv", 4)):
        w.add_uint32(f"llama.{key}", v)
    if note:
        w.add_string("general.description", note)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((mib * MiB // 256, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hubfiles")
    q8 = write_fixture("llama", d / "tiny-Q8_0.gguf", quant="Q8_0")
    f16 = write_fixture("llama", d / "tiny-F16.gguf", quant="F16")
    with GGUFFile(q8) as f:
        shards = write_plan(f, plan_split(f, d / "tiny-Q8_0", max_tensors=8))
    hostile = bytearray((d / "tiny-F16.gguf").read_bytes())
    struct.pack_into("<Q", hostile, 24, 1 << 40)  # the first metadata key claims to be 1 TiB long
    (d / "hostile.gguf").write_bytes(hostile)
    long = _big(d / "long-F32.gguf", 3, "x" * (3 * MiB // 2))
    return {"q8": q8, "f16": f16, "big": _big(d / "big-F32.gguf"), "long": long,
            "hostile": d / "hostile.gguf", **{f"shard{i}": p for i, p in enumerate(shards)}}


@pytest.fixture
def server(files):
    s = HubServer()
    s.add_repo("org/tiny-GGUF", {"tiny-Q8_0.gguf": files["q8"], "tiny-F16.gguf": files["f16"],
                                 "README.md": b"# tiny\n"}, downloads=50, likes=1,
               last_modified="2026-03-01T00:00:00.000Z")
    s.add_repo("org/split-GGUF", {f"Q8_0/{files[f'shard{i}'].name}": files[f"shard{i}"] for i in range(3)},
               downloads=5, likes=9, last_modified="2026-05-01T00:00:00.000Z")
    s.add_repo("org/big-GGUF", {"big-F32.gguf": files["big"], "long-F32.gguf": files["long"],
                                "bad-F32.gguf": files["hostile"]})
    s.add_repo("org/gated-GGUF", {"tiny-Q8_0.gguf": files["q8"]}, gated=True, granted={"hf_testtoken"})
    s.add_repo("org/safetensors-only", {"model.safetensors": b"\0" * 64, "README.md": b"no gguf\n"}, downloads=99)
    with s:
        yield s


def _env(server: HubServer, home: Path, token: str | None = None) -> dict[str, str]:
    """The hub's environment, with HOME (the library's stores, cache and settings) inside the test's folder."""
    e = {k: v for k, v in server.env(home, token=token).items() if not k.startswith("XDG_")}
    e.update(PYTHONPATH=os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1", HOME=str(home / "user"))
    return e


def local_models(server: HubServer, home: Path) -> list[dict]:
    r = run(server, home, "models", "list", "--local", "--json")
    assert r.returncode == 0, r.stderr
    return [m for m in json.loads(r.stdout)["models"] if m["source"] == "hf"]


def run(server: HubServer, home: Path, *args: str, token: str | None = None, **env: str) -> subprocess.CompletedProcess:
    e = _env(server, home, token)
    e.update(env)
    return subprocess.run([*CLI, *args], env=e, capture_output=True, text=True, timeout=300)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]  # (progress lines may come before it)
    errors = [ln for ln in lines if "error" in ln.lower()]
    assert errors == lines[-1:] and lines[-1].startswith("quantscope: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[-1]


def cache_files(home: Path) -> list[Path]:
    root = home / "hub"
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()) if root.exists() else []


def test_pull_lists_then_downloads_into_the_cache(server, files, tmp_path):
    r = run(server, tmp_path, "pull", "org/tiny-GGUF")
    line = one_error_line(r)
    assert "choose one with org/tiny-GGUF:QUANT" in line and "Q8_0" in line and "F16" in line
    r = run(server, tmp_path, "pull", "hf.co/org/tiny-GGUF:q8_0")  # case-insensitive, llama.cpp's hf.co form
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.is_symlink() and "snapshots" in path.parts and path.name == "tiny-Q8_0.gguf"
    assert path.read_bytes() == files["q8"].read_bytes()
    assert "download tiny-Q8_0.gguf: 100%" in r.stderr and "verify tiny-Q8_0.gguf: 100%" in r.stderr
    assert server.bytes_served("org/tiny-GGUF", "tiny-Q8_0.gguf") == files["q8"].stat().st_size
    assert not [p for p in cache_files(tmp_path) if p.name.endswith(".incomplete")]
    # the downloaded file is in the library
    rows = local_models(server, tmp_path)
    assert [(x["name"], x["architecture"], x["file_type"]) for x in rows] == [
        ("org/tiny-GGUF/tiny-Q8_0.gguf", "llama", "Q8_0")]
    r = run(server, tmp_path, "pull", "org/tiny-GGUF:Q5_K_M")
    assert "has no Q5_K_M file; it has Q8_0, F16" in one_error_line(r)


def test_resume_after_a_cut_connection(server, files, tmp_path):
    # the client writes what it read in 10 MiB chunks and resumes from the last one it wrote
    key, size = "org/big-GGUF/big-F32.gguf", files["big"].stat().st_size
    server.cut_after[key] = 11 * MiB
    r = run(server, tmp_path, "pull", "org/big-GGUF:big-F32.gguf")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_bytes() == files["big"].read_bytes()
    gets = [rng for m, p, rng in server.log if m == "GET" and p.endswith("/big-F32.gguf")]
    assert gets == [None, f"bytes={10 * MiB}-"]  # the second request asks for the rest only
    assert server.bytes_served("org/big-GGUF", "big-F32.gguf") == 11 * MiB + size - 10 * MiB


def test_a_corrupted_byte_is_refused_and_nothing_kept(server, tmp_path):
    server.corrupt.add("org/tiny-GGUF/tiny-Q8_0.gguf")
    line = one_error_line(run(server, tmp_path, "pull", "org/tiny-GGUF:Q8_0"))
    assert "SHA-256 mismatch" in line and "removed" in line
    assert not [p for p in cache_files(tmp_path) if p.name.endswith(".gguf") or "blobs" in p.parts]
    assert local_models(server, tmp_path) == []
    server.corrupt.clear()  # the next run downloads it again, whole
    assert run(server, tmp_path, "pull", "org/tiny-GGUF:Q8_0").returncode == 0


def test_gated_repo_needs_a_token(server, files, tmp_path):
    line = one_error_line(run(server, tmp_path, "pull", "org/gated-GGUF:Q8_0"))
    assert "org/gated-GGUF is gated" in line and "HF_TOKEN" in line
    line = one_error_line(run(server, tmp_path, "pull", "org/gated-GGUF:Q8_0", token="hf_testtoken_other"))
    assert "is gated" in line
    assert not [p for p in cache_files(tmp_path) if p.name.endswith(".gguf")]
    r = run(server, tmp_path, "pull", "org/gated-GGUF:Q8_0", token="hf_testtoken")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_bytes() == files["q8"].read_bytes()
    # a saved token (HF_HOME/token, what `hf auth login` writes) is used as well
    home2 = tmp_path / "saved"
    home2.mkdir()
    (home2 / "token").write_text("hf_testtoken")
    r = run(server, home2, "pull", "org/gated-GGUF:Q8_0", HF_HUB_DISABLE_IMPLICIT_TOKEN="0")
    assert r.returncode == 0, r.stderr


def test_a_repo_without_gguf(server, tmp_path):
    assert one_error_line(run(server, tmp_path, "pull", "org/safetensors-only")).endswith(
        "org/safetensors-only has no GGUF files")
    r = run(server, tmp_path, "hub", "files", "org/safetensors-only")
    assert r.returncode == 0 and "has no GGUF files" in r.stdout
    line = one_error_line(run(server, tmp_path, "pull", "org/absent"))
    assert "org/absent: no such repository" in line


def test_a_three_shard_set(server, files, tmp_path):
    r = run(server, tmp_path, "hub", "files", "org/split-GGUF", "--json")
    assert r.returncode == 0, r.stderr
    (model,) = json.loads(r.stdout)["models"]
    assert model["quant"] == "Q8_0" and model["shards"] == 3
    assert model["size"] == sum(files[f"shard{i}"].stat().st_size for i in range(3))
    r = run(server, tmp_path, "pull", "org/split-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    paths = [Path(p) for p in r.stdout.split()]
    assert [p.name for p in paths] == [files[f"shard{i}"].name for i in range(3)]
    assert all(p.read_bytes() == files[f"shard{i}"].read_bytes() for i, p in enumerate(paths))
    rows = local_models(server, tmp_path)
    assert [(x["shards"], x["architecture"]) for x in rows] == [(3, "llama")]
    # offline: the same pull answers from the cache, without a request
    before = len(server.log)
    r = run(server, tmp_path, "pull", "org/split-GGUF:Q8_0", HF_HUB_OFFLINE="1")
    assert r.returncode == 0, r.stderr
    assert [Path(p) for p in r.stdout.split()] == paths and len(server.log) == before
    line = one_error_line(run(server, tmp_path, "pull", "org/tiny-GGUF:Q8_0", HF_HUB_OFFLINE="1"))
    assert "HF_HUB_OFFLINE" in line
    # a set with a shard missing on the hub is named, not half downloaded
    server.repos["org/split-GGUF"].files.pop(f"Q8_0/{files['shard1'].name}")
    line = one_error_line(run(server, tmp_path / "h2", "pull", "org/split-GGUF:Q8_0"))
    assert "1 of its 3 shards are missing" in line


def test_a_slow_server_shows_progress_and_cancels_cleanly(server, files, tmp_path):
    key = "org/big-GGUF/big-F32.gguf"
    server.slow = 0.001
    server.hold_after[key] = 11 * MiB  # the client has read one 10 MiB chunk, then the server stalls
    e = _env(server, tmp_path)
    p = subprocess.Popen([*CLI, "pull", "org/big-GGUF:big-F32.gguf"], env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in p.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("download big-F32.gguf:"):
                break
        assert "big-F32.gguf" in seen[0] and "download big-F32.gguf: " in seen[-1], seen
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "quantscope: interrupted" in err and "Traceback" not in err
    left = cache_files(tmp_path)
    assert not [x for x in left if "blobs" in x.parts or x.name.endswith((".gguf", ".incomplete"))], left
    # unheld, the whole file comes, with progress
    server.hold_after.clear()
    r = run(server, tmp_path, "pull", "org/big-GGUF:big-F32.gguf")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_bytes() == files["big"].read_bytes()
    assert "download big-F32.gguf: 100%" in r.stderr


CANCEL_SCRIPT = """
import sys
from quantscope.core import hub
from quantscope.core.jobs import Cancelled, CancelToken
repo, name, when = sys.argv[1:4]
token = CancelToken()
qset = hub.select(hub.gguf_sets(hub.repo_files(repo)), name, repo)
stop = lambda *_: token.cancel()
try:
    hub.download(repo, qset, progress=stop if when == "download" else None,
                 verify=stop if when == "verify" else None, cancel=token)
    print("done")
except Cancelled:
    print("cancelled")
"""


@pytest.mark.parametrize("when", ["download", "verify"])
def test_a_cancel_token_stops_a_download_and_leaves_nothing(server, tmp_path, when):
    # what the app's Cancel does (core/hub.py download(cancel=…)): during the transfer or the SHA-256 check
    r = subprocess.run([sys.executable, "-c", CANCEL_SCRIPT, "org/big-GGUF", "big-F32.gguf", when],
                       env=_env(server, tmp_path), capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "cancelled", r.stderr
    left = cache_files(tmp_path)
    assert not [x for x in left if "blobs" in x.parts or x.name.endswith((".gguf", ".incomplete"))], left


def test_peek_reads_the_header_only(server, files, tmp_path):
    r = run(server, tmp_path, "inspect", "--json", "hf://org/big-GGUF/big-F32.gguf")
    assert r.returncode == 0, r.stderr
    remote = json.loads(r.stdout)
    served = server.bytes_served("org/big-GGUF", "big-F32.gguf")
    assert served == remote["fetched_bytes"] == core_hub.PEEK_FIRST  # the first MiB holds the header: nothing more
    local = json.loads(subprocess.run([*CLI, "inspect", "--json", str(files["big"])], capture_output=True,
                                      text=True, check=True).stdout)
    for k in ("path", "fetched_bytes"):
        remote.pop(k, None)
        local.pop(k, None)
    assert remote == local  # the same overview as the local file's
    assert not cache_files(tmp_path)  # nothing downloaded
    # a header longer than the first MiB: fetched in growing prefixes, the header and at most what was asked
    r = run(server, tmp_path, "inspect", "hf://org/big-GGUF/long-F32.gguf")
    assert r.returncode == 0, r.stderr
    with GGUFFile(files["long"]) as f:
        header = f.header_end
    served = server.bytes_served("org/big-GGUF", "long-F32.gguf")
    assert header < served <= 2 * header and served < files["long"].stat().st_size
    assert f"Fetched     {served:,} of" in r.stdout


def test_peek_fetches_only_the_blocks_asked_for(server, files, tmp_path):
    args = ["dump-block", "--json", "token_embd.weight", "--row", "40000", "--block", "3"]
    r = run(server, tmp_path, *args[:2], "hf://org/big-GGUF/big-F32.gguf", *args[2:])
    assert r.returncode == 0, r.stderr
    local = subprocess.run([*CLI, *args[:2], str(files["big"]), *args[2:]], capture_output=True, text=True,
                           check=True)
    assert json.loads(r.stdout) == json.loads(local.stdout)
    # the header's first MiB, then the 4 bytes of one F32 "block", by a ranged read 10 MiB into the file
    assert server.bytes_served("org/big-GGUF", "big-F32.gguf") == core_hub.PEEK_FIRST + 4
    assert not cache_files(tmp_path)


def test_peek_refuses_a_hostile_header_like_a_local_file(server, files, tmp_path):
    line = one_error_line(run(server, tmp_path, "inspect", "hf://org/big-GGUF/bad-F32.gguf"))
    local = one_error_line(subprocess.run([*CLI, "inspect", str(files["hostile"])], capture_output=True, text=True))
    assert line.split("not a readable GGUF file: ")[1] == local.split("not a readable GGUF file: ")[1]
    assert "implausible" in line
    assert one_error_line(run(server, tmp_path, "inspect", "hf://org/big-GGUF")).endswith(
        "give a remote file as hf://org/repo/file.gguf")
    assert "not in the repository" in one_error_line(run(server, tmp_path, "inspect", "hf://org/big-GGUF/no.gguf"))


def test_search_and_files(server, files, tmp_path):
    r = run(server, tmp_path, "hub", "search", "GGUF", "--json")
    assert [h["id"] for h in json.loads(r.stdout)] == ["org/tiny-GGUF", "org/split-GGUF", "org/big-GGUF",
                                                       "org/gated-GGUF"]
    r = run(server, tmp_path, "hub", "search", "gguf", "--sort", "likes", "--limit", "1")
    assert r.returncode == 0 and "org/split-GGUF" in r.stdout and "org/tiny-GGUF" not in r.stdout
    r = run(server, tmp_path, "hub", "search", "--sort", "recent", "--json")
    ids = [h["id"] for h in json.loads(r.stdout)]
    assert ids[:2] == ["org/split-GGUF", "org/tiny-GGUF"] and "org/safetensors-only" not in ids
    r = run(server, tmp_path, "hub", "files", "org/tiny-GGUF", "--ctx", "256")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "KV cache" in lines[0] and "at context 256" in lines[0]
    assert [ln.split()[0] for ln in lines[2:]] == ["Q8_0", "F16"]
    assert all(ln.split()[4] in ("fits", "tight", "too", "?") for ln in lines[2:])
    js = json.loads(run(server, tmp_path, "hub", "files", "org/tiny-GGUF", "--ctx", "256", "--json").stdout)
    with GGUFFile(files["q8"]) as f:
        plan = memory_plan(f, 256)
    assert js["kv_bytes"] == plan.kv_bytes + plan.state_bytes > 0  # from the peeked header, as for the local file
    assert [m["needs"] - m["size"] for m in js["models"]] == [js["kv_bytes"]] * 2


def test_names():
    assert core_hub.quant_of("Qwen3-8B-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert core_hub.quant_of("gemma-3-1b-it-q4_k_m.gguf") == "Q4_K_M"
    assert core_hub.quant_of("model-IQ2_XXS-00001-of-00002.gguf") == "IQ2_XXS"
    assert core_hub.quant_of("model.gguf") is None
    assert core_hub.parse_repo_ref("https://huggingface.co/org/repo") == ("org/repo", None)
    for bad in ("org", "org/../x", "org/repo/extra", "org/-x"):
        with pytest.raises(core_hub.HubError):
            core_hub.parse_repo_ref(bad)


def test_publish_uploads_the_file_and_its_card(server, files, tmp_path):
    rules = tmp_path / "rules.txt"
    rules.write_text("blk\\..*\\.ffn_down=Q8_0\n")
    args = ["publish", str(files["shard0"]), "me/tiny-split-GGUF", "--base-model", "org/tiny-base",
            "--tensor-type-file", str(rules)]
    r = run(server, tmp_path, *args, "--dry-run")
    assert r.returncode == 0, r.stderr
    card = r.stdout
    head = '---\nbase_model: "org/tiny-base"\ntags:\n- gguf\n- quantscope\nquantized_by: "quantscope"\n---\n'
    assert card.startswith(head)
    assert "| Q8_0 |" in card and "| F32 |" in card and "blk\\..*\\.ffn_down=Q8_0" in card
    assert "| Shards | 3" in card and "me/tiny-split-GGUF" not in server.repos
    line = one_error_line(run(server, tmp_path, *args))  # no token
    assert "HTTP 401" in line and "me/tiny-split-GGUF" not in server.repos
    r = run(server, tmp_path, *args, token="hf_testtoken")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(f"{server.url}/me/tiny-split-GGUF/commit/")
    repo = server.repos["me/tiny-split-GGUF"]
    assert sorted(repo.files) == sorted(["README.md", *(files[f"shard{i}"].name for i in range(3))])
    assert repo.files["README.md"].decode() + "\n" == card  # the card shown by --dry-run
    assert [c["files"] for c in server.commits] == [sorted(repo.files)]  # one commit
    assert server.cards == [{"base_model": "org/tiny-base", "tags": ["gguf", "quantscope"],
                             "quantized_by": "quantscope"}]  # the front matter parses as the hub reads it
    # what was published downloads back, every shard the same bytes
    r = run(server, tmp_path, "pull", "me/tiny-split-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    assert [Path(p).read_bytes() for p in r.stdout.split()] == [files[f"shard{i}"].read_bytes() for i in range(3)]
    # publishing again into the existing repository is a second commit
    assert run(server, tmp_path, *args, token="hf_testtoken").returncode == 0
    assert len(server.commits) == 2


def test_the_card_shows_the_target_size_measurements(files, tmp_path):
    # a real `quantize --target-size --json` report (the tiny F16 model, a short calibration text)
    from .arch_fixtures import vocabulary

    f16 = write_fixture("llama", tmp_path / "tiny-F16.gguf", quant="F16", vocab=vocabulary())
    cal = tmp_path / "cal.txt"
    cal.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "tiny-mix.gguf"
    q = subprocess.run([*CLI, "quantize", str(f16), str(out), "--target-size", "300K", "-f", str(cal), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert q.returncode == 0, q.stderr
    report = tmp_path / "target.json"
    report.write_text(q.stdout)
    summary = json.loads(q.stdout)["summary"]
    r = subprocess.run([*CLI, "publish", str(out), "me/tiny-mix", "--target-report", str(report), "--calibration",
                        str(cal), "--dry-run"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "## Measured against the base" in r.stdout
    assert f"| Predicted mean KLD | {summary['predicted_kld']:.5f} |" in r.stdout
    assert f"| Bits per weight | {summary['bpw_out']:.3f} |" in r.stdout
    assert f"- calibration text: `cal.txt`, {cal.stat().st_size:,} bytes" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"tensors": []}')
    r = subprocess.run([*CLI, "publish", str(out), "me/tiny-mix", "--target-report", str(bad), "--dry-run"],
                       capture_output=True, text=True, timeout=300)
    assert "is not the JSON of `quantscope quantize --target-size" in one_error_line(r)
