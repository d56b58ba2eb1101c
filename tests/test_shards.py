"""Split models: `split`/`merge` byte for byte like llama-gguf-split (tests/data/shards/meta.json, recorded by
tests/record_shard_fixtures.py), opening any shard as the whole model, the refusals of broken sets (each naming the
file), all-or-nothing outputs, and the consumers that read tensor bytes (quantize, bump conversion, the engine)
giving the same results from a split model as from the file it was split from."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from quantscope.cli.main import main as cli_main
from quantscope.core.analysis import can_read_values, dequantize_rows
from quantscope.core.fsutil import PathRefused
from quantscope.core.gguf import GGUFFile, ShardError, shard_path, shard_prefix, sibling_shards
from quantscope.core.gguf.split import (
    SplitError,
    _header,
    _kv_i32,
    _kv_u16,
    merge_gguf,
    parse_size,
    plan_split,
    split_gguf,
)
from quantscope.core.jobs import Cancelled, CancelToken

from . import quantize_models
from .record_shard_fixtures import CASES, COMMITTED, write_source

DATA = Path(__file__).parent / "data" / "shards"
META = json.loads((DATA / "meta.json").read_text())
SMALL = DATA / "small.gguf"
SHARDS = sorted(DATA.glob("small-0000?-of-00004.gguf"))
MERGED = DATA / "small-merged.gguf"


def sha(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def files(folder: Path) -> list[dict[str, object]]:
    return [{"name": p.name, "size": p.stat().st_size, "sha256": sha(p)} for p in sorted(folder.iterdir())]


def options(args: list[str]) -> dict[str, object]:
    """split_gguf's keywords for llama-gguf-split's arguments."""
    kw: dict[str, object] = {}
    for i, a in enumerate(args):
        if a == "--split-max-tensors":
            kw["max_tensors"] = int(args[i + 1])
        elif a == "--split-max-size":
            kw["max_size"] = parse_size(args[i + 1])
        elif a == "--no-tensor-first-split":
            kw["no_tensor_first_split"] = True
    return kw


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The models the fixtures were recorded from, re-made and checked against the recorded hashes."""
    d = tmp_path_factory.mktemp("sources")
    out = {}
    for m, rec in META["models"].items():
        p = write_source(m, d / f"{m}.gguf")
        assert sha(p) == rec["sha256"], f"{m}: the generated model's bytes changed (gguf-py version?)"
        out[m] = p
    return out


def copy_set(tmp_path: Path) -> list[Path]:
    d = tmp_path / "set"
    d.mkdir()
    return [Path(shutil.copy(p, d / p.name)) for p in SHARDS]


# ------------------------------------------------------------------------------------- byte identity (oracle)
def test_fixtures_are_what_was_recorded():
    case = META["cases"][COMMITTED]
    assert [{"name": p.name, "size": p.stat().st_size, "sha256": sha(p)} for p in SHARDS] == case["split"]
    assert files_of(MERGED) == case["merged"]
    assert sha(SMALL) == META["models"]["small"]["sha256"]
    assert {c for c, *_ in CASES} == set(META["cases"])


def files_of(p: Path) -> list[dict[str, object]]:
    return [{"name": p.name, "size": p.stat().st_size, "sha256": sha(p)}]


@pytest.mark.parametrize("case", [c for c, *_ in CASES])
def test_split_and_merge_match_llama_gguf_split(tmp_path, sources, case):
    rec = META["cases"][case]
    model = rec["model"]
    out = tmp_path / "split"
    out.mkdir()  # writers do not create folders
    plan = split_gguf(sources[model], out / model, **options(rec["args"]))
    assert files(out) == rec["split"]
    assert plan.report() == rec["plan"]
    if "merged" in rec:
        first = sorted(out.iterdir())[-1]  # the last shard: any shard names the set
        merged = tmp_path / "merged" / f"{model}-merged.gguf"
        merged.parent.mkdir()
        merge_gguf(first, merged)
        assert files(merged.parent) == rec["merged"]


def test_dry_run_writes_nothing(tmp_path, sources):
    plan = split_gguf(sources["big"], tmp_path / "out" / "big", max_size=parse_size("1M"), dry_run=True)
    assert plan.report() == META["cases"]["big-1M"]["plan"]
    assert [s.path.name for s in plan.shards] == [f["name"] for f in META["cases"]["big-1M"]["split"]]
    assert [s.size for s in plan.shards] == [f["size"] for f in META["cases"]["big-1M"]["split"]]
    assert not (tmp_path / "out").exists()


def test_resplitting_a_split_model_is_splitting_the_merged_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = split_gguf(SHARDS[2], tmp_path / "a" / "x", max_tensors=5)
    b = split_gguf(MERGED, tmp_path / "b" / "x", max_tensors=5)
    assert [s.path.name for s in a.shards] == [s.path.name for s in b.shards]
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert files(tmp_path / "b") != []


def test_parse_size():
    assert parse_size("2G") == 2_000_000_000
    assert parse_size("500M") == 500_000_000
    for bad, why in [("1.5G", "whole number"), ("2g", "units are M"), ("0M", "1.."), ("G", "whole number"),
                     ("", "units are M"), ("12", "units are M"), ("-3M", "whole number"), ("2T", "units are M"),
                     ("99999999999G", "1..")]:
        with pytest.raises(SplitError, match=why):
            parse_size(bad)


def test_split_refusals(tmp_path, sources):
    with GGUFFile(sources["big"]) as f:
        with pytest.raises(SplitError, match="alone exceeds the maximum shard size"):
            plan_split(f, tmp_path / "x", max_size=100_000)  # token_embd is 417,792 bytes
        with pytest.raises(SplitError, match="not both"):
            plan_split(f, tmp_path / "x", max_size=10**6, max_tensors=3)
        with pytest.raises(SplitError, match=r"1\.\.2147483647"):
            plan_split(f, tmp_path / "x", max_tensors=0)
    with pytest.raises(SplitError, match="is not a shard of a split model"):
        merge_gguf(SMALL, tmp_path / "m.gguf")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------- opening a set
@pytest.mark.parametrize("i", range(4))
def test_any_shard_opens_the_whole_model(i):
    with GGUFFile(SMALL) as ref, GGUFFile(SHARDS[i]) as f:
        assert f.is_split and not ref.is_split
        assert f.path == SHARDS[0] and f.paths == SHARDS
        assert [s.n_tensors for s in f.shards] == [4, 4, 4, 4]
        assert [s.first_tensor for s in f.shards] == [0, 4, 8, 12]
        assert f.file_size == sum(p.stat().st_size for p in SHARDS)
        assert [t.shard for t in f.tensors] == [k // 4 for k in range(16)]
        assert [(t.name, t.ne, t.type_id) for t in f.tensors] == [(t.name, t.ne[:_nd(t.ne)], t.type_id)
                                                                for t in ref.tensors]
        assert f.architecture == "llama" and f.get("general.name") == "quantscope-shards-small"
        assert list(f.metadata)[-3:] == ["split.no", "split.tensors.count", "split.count"]
        assert list(f.metadata)[:-3] == list(ref.metadata)
        for t in ref.tensors:
            u = f.tensor(t.name)
            assert np.array_equal(f.tensor_bytes(u), ref.tensor_bytes(t)), t.name
            if can_read_values(t):
                assert np.array_equal(dequantize_rows(f, u, 0, u.n_rows), dequantize_rows(ref, t, 0, t.n_rows))
        a = f.tensor("blk.1.attn_norm.weight")
        assert a.shard == 1 and np.array_equal(f.tensor_array(a), ref.tensor_array("blk.1.attn_norm.weight"))
        e = f.tensor("output.weight")
        assert e.shard == 3 and f.block_bytes(e, 47, 1) == ref.block_bytes("output.weight", 47, 1)
        off, n = f.block_location(e, 47, 1)
        assert SHARDS[3].read_bytes()[off:off + n] == f.block_bytes(e, 47, 1)


def _nd(ne: tuple[int, ...]) -> int:
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return n


def test_shards_written_by_gguf_py(tmp_path):
    """gguf-py's GGUFWriter splits too (convert_hf_to_gguf --split-max-tensors): its sets open the same way."""
    write_source("small", tmp_path / "g.gguf", split_max_tensors=5)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"g-0000{i}-of-00004.gguf" for i in (1, 2, 3, 4)]
    with GGUFFile(tmp_path / names[3]) as f, GGUFFile(SMALL) as ref:
        assert [s.n_tensors for s in f.shards] == [5, 5, 5, 1]
        assert [t.name for t in f.tensors] == [t.name for t in ref.tensors]
        assert all(np.array_equal(f.tensor_bytes(t.name), ref.tensor_bytes(t)) for t in ref.tensors)
        assert list(f.metadata)[:-3] == list(ref.metadata)


def test_one_shard_alone_and_the_merged_file():
    with GGUFFile(SHARDS[1], whole_set=False) as f:
        assert not f.is_split and len(f.tensors) == 4 and f.get("split.no") == 1
        assert list(f.metadata) == ["split.no", "split.tensors.count", "split.count"]
        assert f.paths == [SHARDS[1]] and f.shards[0].n_tensors == 4
    with GGUFFile(MERGED) as m, GGUFFile(SMALL) as ref:
        assert not m.is_split and m.get("split.count") == 0 and len(m.tensors) == 16
        assert all(np.array_equal(m.tensor_bytes(t.name), ref.tensor_bytes(t)) for t in ref.tensors)


def test_shard_names():
    assert shard_path("/m/x", 1, 3) == Path("/m/x-00002-of-00003.gguf")
    assert shard_prefix("/m/x-00002-of-00003.gguf", 1, 3) == "/m/x"
    assert shard_prefix("/m/x-00002-of-00003.gguf", 0, 3) is None
    assert shard_prefix("-00001-of-00003.gguf", 0, 3) is None
    assert sibling_shards("/m/x-00002-of-00003.gguf") == [Path(f"/m/x-0000{i}-of-00003.gguf") for i in (1, 2, 3)]
    assert sibling_shards("/m/x.gguf") == [Path("/m/x.gguf")]
    assert sibling_shards("/m/x-00004-of-00003.gguf") == [Path("/m/x-00004-of-00003.gguf")]


# ------------------------------------------------------------------------------------- broken sets
def test_missing_shard(tmp_path):
    s = copy_set(tmp_path)
    s[2].unlink()
    for p in (s[0], s[3]):
        with pytest.raises(ShardError, match="missing: shard 3 of the 4 files") as e:
            GGUFFile(p)
        assert e.value.path == s[2] and str(e.value).startswith(f"{s[2]}: ")


def test_renamed_shard(tmp_path):
    s = copy_set(tmp_path)
    moved = s[1].rename(s[1].with_name("renamed.gguf"))
    with pytest.raises(ShardError, match="missing: shard 2") as e:
        GGUFFile(s[0])
    assert e.value.path == s[1]
    with pytest.raises(ShardError, match=r"does not end in -00002-of-00004\.gguf.*renamed") as e:
        GGUFFile(moved)
    assert e.value.path == moved
    with GGUFFile(moved, whole_set=False) as f:  # still readable alone
        assert len(f.tensors) == 4
    moved.rename(s[1])
    link = tmp_path / "model.gguf"
    link.symlink_to(s[0])
    with GGUFFile(link) as f:  # a link to a shard: the others are found beside its target
        assert f.paths == s and len(f.tensors) == 16


def test_integrity_checks_per_shard():
    from quantscope.core.gguf.checks import integrity_checks

    with GGUFFile(SHARDS[1]) as f, GGUFFile(SMALL) as ref:
        checks = {c.name: c for c in integrity_checks(f)}
        assert all(c.ok is not False for c in checks.values()), checks
        # counted per file: attn_k.bias (28 bytes) ends shard 1 (4 bytes after it), rope_freqs (20) is followed by
        # 12 in shard 4; in the unsplit file both are between tensors (20 bytes of padding in all)
        assert checks["padding"].detail == ("13,324 tensor bytes, 16 bytes of alignment padding, 4 bytes after the "
                                            "last tensor")
        assert {c.name: c for c in integrity_checks(ref)}["padding"].detail.startswith("13,324 tensor bytes, 20 ")


def test_shard_of_another_split(tmp_path, sources):
    s = copy_set(tmp_path)
    (tmp_path / "t1").mkdir()
    (tmp_path / "t5").mkdir()
    split_gguf(sources["small"], tmp_path / "t1" / "small", max_tensors=1)  # 16 shards
    shutil.copy(tmp_path / "t1" / "small-00002-of-00016.gguf", s[1])
    with pytest.raises(ShardError, match=r"split\.count is 16, but small-00001-of-00004\.gguf says 4") as e:
        GGUFFile(s[0])
    assert e.value.path == s[1]
    split_gguf(sources["small"], tmp_path / "t5" / "small", max_tensors=5)  # also 4 shards: 5, 5, 5, 1 tensors
    shutil.copy(tmp_path / "t5" / "small-00002-of-00004.gguf", s[1])
    with pytest.raises(ShardError, match=r"tensor 'blk\.1\.attn_q\.weight' is also in .*small-00002-of-00004") as e:
        GGUFFile(s[3])
    assert e.value.path == s[2]  # the set's own shard 3 repeats what the foreign shard 2 holds
    shutil.copy(tmp_path / "t5" / "small-00004-of-00004.gguf", s[3])  # 1 tensor, no duplicate, but a gap
    shutil.copy(SHARDS[1], s[1])
    with pytest.raises(ShardError, match=r"split\.tensors\.count is 16, but the 4 shards hold 13 tensors "
                       r"\(4 in small-00001-of-00004\.gguf, 4 in .*, 1 in small-00004-of-00004\.gguf\)") as e:
        GGUFFile(s[1])
    assert e.value.path == s[0]


def test_truncated_shard(tmp_path):
    s = copy_set(tmp_path)
    with open(s[2], "r+b") as fh:
        fh.truncate(s[2].stat().st_size - 100)
    with pytest.raises(ShardError, match=r"shard 3 of 4 cannot be read: tensor .* lies outside") as e:
        GGUFFile(s[0])
    assert e.value.path == s[2]
    with GGUFFile(s[0], strict=False) as f:  # the explorer: the damaged tensor is marked, the rest readable
        assert len(f.tensors) == 16
        bad = [t for t in f.tensors if t.problem]
        assert bad and {t.shard for t in bad} == {2} and len(f.problems) == len(bad)
        assert all(str(p).startswith(f"{s[2]}: ") for p in f.problems)
        assert np.array_equal(f.tensor_bytes("token_embd.weight"), GGUFFile(SMALL).tensor_bytes("token_embd.weight"))
    with open(s[2], "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(ShardError, match="shard 3 of 4 cannot be read: file is only 10 bytes") as e:
        GGUFFile(s[3], strict=False)
    assert e.value.path == s[2]


def _patch_kv(path: Path, key: str, fmt: str, value: int) -> None:
    with GGUFFile(path, whole_set=False) as f:
        off = f.metadata[key].value_offset
    with open(path, "r+b") as fh:
        fh.seek(off)
        fh.write(struct.pack(fmt, value))


def test_inconsistent_split_keys(tmp_path):
    s = copy_set(tmp_path)
    _patch_kv(s[2], "split.count", "<H", 5)
    with pytest.raises(ShardError, match=r"split\.count is 5, but .* says 4") as e:
        GGUFFile(s[0])
    assert e.value.path == s[2]
    with pytest.raises(ShardError, match=r"does not end in -00003-of-00005\.gguf"):
        GGUFFile(s[2])
    _patch_kv(s[2], "split.count", "<H", 4)
    _patch_kv(s[2], "split.no", "<H", 1)
    with pytest.raises(ShardError, match=r"split\.no is 1, but the file is named as shard 3") as e:
        GGUFFile(s[0])
    assert e.value.path == s[2]
    _patch_kv(s[2], "split.no", "<H", 9)
    with pytest.raises(ShardError, match=r"split\.no is 9.*a shard index 0\.\.3") as e:
        GGUFFile(s[2])
    _patch_kv(s[2], "split.no", "<H", 2)
    _patch_kv(s[3], "split.tensors.count", "<i", 17)
    with pytest.raises(ShardError, match=r"split\.tensors\.count is 17, but .* says 16") as e:
        GGUFFile(s[1])
    assert e.value.path == s[3]
    for p in s:  # every shard agrees, but on a wrong total
        _patch_kv(p, "split.tensors.count", "<i", 15)
    with pytest.raises(ShardError, match=r"split\.tensors\.count is 15, but the 4 shards hold 16 tensors") as e:
        GGUFFile(s[3])
    assert e.value.path == s[0]
    for p in s:
        _patch_kv(p, "split.tensors.count", "<i", 16)
    with GGUFFile(s[3]) as f:  # patched back: whole again
        assert len(f.tensors) == 16


def rewrite_shard(path: Path, extra: list[bytes], rename: dict[str, str] | None = None) -> None:
    """Re-write shard ``path`` with ``extra`` metadata entries before its split keys and tensors renamed."""
    with GGUFFile(path, whole_set=False) as f:
        tensors = [replace(t, name=(rename or {}).get(t.name, t.name)) for t in f.tensors]
        kvs = [f.entry_bytes(k) for k in f.metadata]
        data = [f.tensor_bytes(t).tobytes() for t in f.tensors]
    body = _header(extra + kvs, tensors) + b"".join(d + bytes(-len(d) % 32) for d in data)
    path.write_bytes(body)


def _kv_str(key: str, v: str) -> bytes:
    k, b = key.encode(), v.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(b)) + b


def test_other_architecture_and_duplicate_tensors(tmp_path):
    s = copy_set(tmp_path)
    rewrite_shard(s[1], [_kv_str("general.architecture", "llama")])
    with GGUFFile(s[0]) as f:  # the same architecture repeated is fine: the rewrite itself is sound
        assert len(f.tensors) == 16
    shutil.copy(SHARDS[1], s[1])
    rewrite_shard(s[1], [_kv_str("general.architecture", "qwen2")])
    with pytest.raises(ShardError, match=re.escape("general.architecture is 'qwen2', but small-00001-of-00004.gguf "
                                                           "says 'llama': a shard of another model")) as e:
        GGUFFile(s[3])
    assert e.value.path == s[1]
    shutil.copy(SHARDS[1], s[1])
    rewrite_shard(s[3], [], {"output.weight": "token_embd.weight"})
    with pytest.raises(ShardError, match=re.escape(f"tensor 'token_embd.weight' is also in {s[0]}")) as e:
        GGUFFile(s[2])
    assert e.value.path == s[3]


def test_split_keys_of_the_wrong_type(tmp_path):
    p = tmp_path / "x-00001-of-00002.gguf"
    p.write_bytes(_header([_kv_str("split.count", "2")], []))
    with pytest.raises(ShardError, match=r"split\.count has type STRING; expected an integer") as e:
        GGUFFile(p)
    assert e.value.path == p
    with GGUFFile(p, strict=False) as f:  # the explorer opens it as one file and lists the problem
        assert not f.is_split and [e.path for e in f.problems] == [p]  # type: ignore[attr-defined]
    err = pickle.loads(pickle.dumps(e.value))
    assert isinstance(err, ShardError) and str(err) == str(e.value) and err.path == p
    p.write_bytes(_header([_kv_u16("split.count", 2)], []))
    with pytest.raises(ShardError, match=r"split\.no is missing"):
        GGUFFile(p)
    p.write_bytes(_header([_kv_u16("split.no", 0), _kv_u16("split.count", 2)], []))
    q = tmp_path / "x-00002-of-00002.gguf"
    q.write_bytes(_header([_kv_u16("split.no", 1), _kv_i32("split.tensors.count", 0), _kv_u16("split.count", 2)], []))
    with pytest.raises(ShardError, match=r"split\.tensors\.count is missing from the first shard") as e:
        GGUFFile(q)
    assert e.value.path == p
    p.write_bytes(_header([_kv_u16("split.no", 0), _kv_i32("split.tensors.count", 0), _kv_u16("split.count", 2)],
                          []))
    with GGUFFile(q) as f:  # two files of nothing but split keys: a valid, empty model
        assert f.is_split and f.tensors == [] and f.file_size == 2 * len(p.read_bytes())


# ------------------------------------------------------------------------------------- outputs
def test_cancel_leaves_nothing(tmp_path, sources):
    (tmp_path / "out").mkdir()
    for job in (lambda pr, c: split_gguf(sources["big"], tmp_path / "out" / "b", max_size=10**6, progress=pr,
                                         cancel=c),
                lambda pr, c: merge_gguf(SHARDS[0], tmp_path / "out" / "m.gguf", progress=pr, cancel=c)):
        token = CancelToken()
        seen = []

        def progress(done: int, total: int, token: CancelToken = token, seen: list = seen) -> None:
            seen.append(done)
            token.cancel()

        with pytest.raises(Cancelled):
            job(progress, token)
        assert len(seen) == 1
        assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_killed_split_leaves_nothing(tmp_path, sources):
    out = tmp_path / "out"
    out.mkdir()
    code = ("import sys, time\nfrom quantscope.core.gguf.split import split_gguf\n"
            "def p(d, t):\n    print('progress', flush=True)\n    time.sleep(60)\n"
            f"split_gguf({str(sources['big'])!r}, {str(out / 'b')!r}, max_size=10**6, progress=p)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "progress\n"
        assert out.is_dir()  # the temporaries' folder exists: the split was under way
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert os.listdir(out) == []


def test_outputs_never_overwrite_inputs(tmp_path):
    s = copy_set(tmp_path)
    before = [sha(p) for p in s]
    with pytest.raises(PathRefused, match="is the input file"):
        merge_gguf(s[0], s[2])
    prefix = shard_prefix(s[0], 0, 4)
    assert prefix is not None
    with pytest.raises(PathRefused, match="is the input file"):
        split_gguf(s[1], prefix, max_tensors=4)  # would write the same four names
    assert [sha(p) for p in s] == before
    assert sorted(os.listdir(s[0].parent)) == [p.name for p in s]


def test_outputs_replace_existing_files_atomically(tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    merge_gguf(SHARDS[0], out)
    assert sha(out) == META["cases"][COMMITTED]["merged"][0]["sha256"]


# ------------------------------------------------------------------------------------- command line
def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_split_merge_inspect(tmp_path, capsys, sources):
    for d in ("s", "m"):
        (tmp_path / d).mkdir()
    rc, out, _ = run(capsys, "split", str(sources["big"]), str(tmp_path / "s" / "big"), "--split-max-size", "1M")
    assert rc == 0
    rec = META["cases"]["big-1M"]
    assert out.splitlines()[: len(rec["plan"])] == rec["plan"]
    assert files(tmp_path / "s") == rec["split"]
    shard = tmp_path / "s" / rec["split"][1]["name"]
    rc, out, _ = run(capsys, "merge", str(shard), str(tmp_path / "m" / "big-merged.gguf"))
    assert rc == 0 and out.startswith("wrote ")
    assert files(tmp_path / "m") == rec["merged"]
    rc, out, _ = run(capsys, "split", str(SMALL), str(tmp_path / "d" / "x"), "--split-max-tensors", "4",
                     "--dry-run")
    assert rc == 0 and "would write" in out and not (tmp_path / "d").exists()
    rc, out, _ = run(capsys, "inspect", "--json", str(shard))
    s = json.loads(out)
    assert [sh["tensors"] for sh in s["shards"]] == [f["n"] for f in _plan_counts(rec["plan"])]
    assert s["tensor_count"] == 14 and s["path"] == str(tmp_path / "s" / rec["split"][0]["name"])
    assert all("shard" in t for t in s["tensors"])
    rc, out, _ = run(capsys, "inspect", str(SHARDS[2]))
    assert rc == 0 and "Split       4 files" in out and str(SHARDS[3]) in out
    rc, out, _ = run(capsys, "inspect", "--json", str(SMALL))
    assert "shards" not in json.loads(out)


def _plan_counts(plan: list[str]) -> list[dict[str, int]]:
    return [{"n": int(ln.split("n_tensors = ")[1].split(",")[0])} for ln in plan[1:]]


def test_cli_errors_are_one_line(tmp_path, capsys):
    s = copy_set(tmp_path)
    s[3].unlink()
    for argv, want in [
        (["merge", str(s[0]), str(tmp_path / "m.gguf")], f"quantscope: error: {s[3]}: missing: shard 4 of the 4"),
        (["inspect", str(s[1])], f"{s[3]}: missing: shard 4"),
        (["split", str(SMALL), str(tmp_path / "x"), "--split-max-size", "2g"], "the supported units are M"),
        (["split", str(SMALL), str(tmp_path / "x")], "one of the arguments --split-max-tensors --split-max-size"),
        (["split", str(SMALL), str(tmp_path / "x"), "--split-max-tensors", "0"], "out of range"),
        (["merge", str(SMALL), str(tmp_path / "m.gguf")], "is not a shard of a split model"),
        (["merge", str(s[0]), str(s[1])], None),
        (["split", str(tmp_path / "nope.gguf"), str(tmp_path / "x"), "--split-max-tensors", "2"], "no such file"),
    ]:
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, err)
        assert err.startswith("quantscope: error: ")
        if want is not None:
            assert want in err, (argv, err)
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "x-00001-of-00001.gguf").exists()


# ------------------------------------------------------------------------------------- consumers
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tests/quantize_models.py's llama (F32, 4 layers) and the first of its 4 shards."""
    d = tmp_path_factory.mktemp("tiny")
    src = quantize_models.write_model("llama", d / "llama.gguf")
    (d / "shards").mkdir()
    plan = split_gguf(src, d / "shards" / "llama", max_tensors=12)
    assert len(plan.shards) == 4
    return src, plan.shards[0].path


def test_quantize_a_split_model(tmp_path, tiny):
    from quantscope.core.quant.quantize import QuantizeOptions, quantize_file

    src, shard = tiny
    quantize_file(src, tmp_path / "a.gguf", QuantizeOptions("Q4_K_M"))
    quantize_file(shard, tmp_path / "b.gguf", QuantizeOptions("Q4_K_M"))  # split.* keys are dropped
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    with pytest.raises(PathRefused, match="is the input file"):
        quantize_file(shard, shard.with_name("llama-00003-of-00004.gguf"), QuantizeOptions("Q8_0"))


def test_engine_runs_a_split_model(tiny):
    from quantscope.core.engine.session import Model

    src, shard = tiny
    with GGUFFile(src) as a, GGUFFile(shard) as b:
        la = Model(a, threads=1).session(64).forward([1, 5, 9, 2], all_logits=True)
        lb = Model(b, threads=1).session(64).forward([1, 5, 9, 2], all_logits=True)
        assert la.shape == lb.shape and np.array_equal(la, lb)


def test_bump_conversion_of_a_split_model(tmp_path):
    from quantscope.core.bump import ConvertJob

    from .test_bump import write_model

    src = write_model(tmp_path / "m.gguf", "qwen2", biases=True)
    (tmp_path / "s").mkdir()
    plan = split_gguf(src, tmp_path / "s" / "m", max_tensors=7)
    assert len(plan.shards) > 2
    a = ConvertJob(src, tmp_path / "a.bump").run()
    b = ConvertJob(plan.shards[1].path, tmp_path / "b.bump").run()
    assert (tmp_path / "a.bump").read_bytes() == (tmp_path / "b.bump").read_bytes()
    assert a.sha256 == b.sha256
    with pytest.raises(PathRefused, match="is the input file"):
        ConvertJob(plan.shards[1].path, plan.shards[2].path).check()


# ------------------------------------------------------------------------------------- a real model
def test_real_model_split_and_merge_round_trip(tmp_path, model_path):
    """Qwen2.5-Coder-0.5B (491 MB) in shards of at most 200M and merged back: every shard holds the original's
    bytes, and the merged file is the original byte for byte but for the three split keys llama-gguf-split
    appends (re-splitting it gives the same shards)."""
    src = model_path("qwen2.5-coder")
    t0 = time.perf_counter()
    (tmp_path / "s").mkdir()
    (tmp_path / "m").mkdir()
    plan = split_gguf(src, tmp_path / "s" / "qwen", max_size=parse_size("200M"))
    assert [s.path.name for s in plan.shards] == [f"qwen-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(s.size <= 200_000_000 + len(s.header) for s in plan.shards)
    merged = tmp_path / "m" / "qwen.gguf"
    merge_gguf(plan.shards[2].path, merged)
    seconds = time.perf_counter() - t0
    with GGUFFile(src) as o, GGUFFile(merged) as m, GGUFFile(plan.shards[1].path) as s:
        assert [t.name for t in s.tensors] == [t.name for t in o.tensors]
        assert list(m.metadata) == [*o.metadata, "split.no", "split.tensors.count", "split.count"]
        keys = b"".join(o.entry_bytes(k) for k in o.metadata) + _kv_u16("split.no", 0) + \
            _kv_i32("split.tensors.count", len(o.tensors)) + _kv_u16("split.count", 0)
        head = o.header_end - (o.tensors[0].info_offset if o.tensors else o.header_end)
        want = (b"GGUF" + struct.pack("<IQQ", 3, len(o.tensors), len(o.metadata) + 3) + keys
                + _read(src, o.tensors[0].info_offset, head))
        assert _read(merged, 0, m.header_end) == want
        assert _read(merged, m.header_end, m.data_start - m.header_end) == bytes(m.data_start - m.header_end)
        assert m.file_size - m.data_start == o.file_size - o.data_start
        assert _digest(merged, m.data_start) == _digest(src, o.data_start)
        for t in s.tensors[::25]:
            assert np.array_equal(s.tensor_bytes(t), o.tensor_bytes(t.name))
    again = split_gguf(merged, tmp_path / "s2" / "qwen", max_size=parse_size("200M"), dry_run=True)
    assert [x.header for x in again.shards] == [_read(p.path, 0, len(p.header)) for p in plan.shards]
    print(f"split + merge of {src.stat().st_size:,} bytes: {seconds:.1f} s")


def _read(p: Path, off: int, n: int) -> bytes:
    with open(p, "rb") as fh:
        fh.seek(off)
        return fh.read(n)


def _digest(p: Path, start: int) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        fh.seek(start)
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
