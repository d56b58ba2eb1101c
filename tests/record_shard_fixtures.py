"""Record llama-gguf-split's output for the shard tests (tests/test_shards.py).

Two small models are written with gguf-py (pinned) from seeded generators, so their bytes depend only on the code
here: ``small`` (~16 KB: F32, F16, BF16, Q8_0, Q4_0 and I32 tensors, 1-, 2- and 3-D, one with a trailing
dimension of 1, sizes that need padding, a string-array vocabulary) and ``big`` (~2.4 MB of F32/F16/Q8_0, for
``--split-max-size``, whose smallest unit is 1M). llama-gguf-split (tests/bench/llamacpp_build.py's build) then
runs every case of :data:`CASES` (split, and merge of the split's first shard).

tests/data/shards/ receives ``small.gguf``, the shards of ``small`` split by 4 tensors and the merged file (the
tests open them as recorded), and meta.json: the tool version, each model's SHA-256, and per case the arguments
and every output file's name, size and SHA-256.

Usage: python tests/record_shard_fixtures.py [--llama-build DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "shards"
MODELS = ("small", "big")
#: (case name, model, llama-gguf-split arguments before IN OUT, whether to merge the result back)
CASES: tuple[tuple[str, str, tuple[str, ...], bool], ...] = (
    ("small-t4", "small", ("--split", "--split-max-tensors", "4"), True),
    ("small-t1", "small", ("--split", "--split-max-tensors", "1"), False),
    ("small-t4-nofirst", "small", ("--split", "--split-max-tensors", "4", "--no-tensor-first-split"), True),
    ("small-t100", "small", ("--split", "--split-max-tensors", "100"), True),
    ("big-1M", "big", ("--split", "--split-max-size", "1M"), True),
    ("big-1M-nofirst", "big", ("--split", "--split-max-size", "1M", "--no-tensor-first-split"), False),
    ("big-t3", "big", ("--split", "--split-max-tensors", "3"), True),
)
#: the case whose files are committed (the reader tests open them)
COMMITTED = "small-t4"


def write_source(name: str, path: str | Path, **writer_options: int) -> Path:
    """Write model ``name`` (``small`` or ``big``) to ``path`` with gguf-py; the bytes depend only on ``name``.
    ``writer_options`` go to ``GGUFWriter`` (``split_max_tensors=5``: gguf-py's own shards ``PATH-00001-of-…``)."""
    import gguf
    import numpy as np

    if name not in MODELS:
        raise KeyError(name)
    rng = np.random.default_rng([1919, sum(name.encode())])
    w = gguf.GGUFWriter(str(path), "llama", **writer_options)  # type: ignore[arg-type]
    w.add_string("general.name", f"quantscope-shards-{name}")
    w.add_uint32("llama.context_length", 128)
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_bool("quantscope.test.flag", True)
    w.add_array("quantscope.test.ints", [3, 1, 4, 1, 5, 9, 2, 6])
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(48)])
    w.add_uint32("general.file_type", 7)

    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def quant(a: np.ndarray, qt: gguf.GGMLQuantizationType) -> np.ndarray:
        return gguf.quants.quantize(a, qt)

    Q8, Q4, BF16 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.BF16
    if name == "small":
        w.add_tensor("token_embd.weight", quant(f32(48, 64), Q8), raw_dtype=Q8)
        for i in range(2):
            p = f"blk.{i}."
            w.add_tensor(p + "attn_norm.weight", f32(64))
            w.add_tensor(p + "attn_q.weight", f32(16, 64).astype(np.float16))
            w.add_tensor(p + "attn_k.bias", f32(7))  # 28 bytes: padded
            w.add_tensor(p + "ffn_up.weight", quant(f32(8, 64), Q4), raw_dtype=Q4)
            w.add_tensor(p + "ffn_gate.weight", quant(f32(4, 64), BF16), raw_dtype=BF16)
            w.add_tensor(p + "ffn_down.weight", f32(1, 40))  # ne [40, 1]: ggml counts one dimension
        w.add_tensor("rope_freqs.weight", rng.integers(-9, 9, 5, dtype=np.int32))
        w.add_tensor("output_norm.weight", f32(2, 3, 16).astype(np.float16))  # 3-D
        w.add_tensor("output.weight", quant(f32(48, 64), Q8), raw_dtype=Q8)
    else:
        w.add_tensor("token_embd.weight", quant(f32(1536, 256), Q8), raw_dtype=Q8)  # 417,792 bytes
        for i in range(4):
            p = f"blk.{i}."
            w.add_tensor(p + "attn_norm.weight", f32(256))
            w.add_tensor(p + "attn_q.weight", f32(256, 512))  # 524,288 bytes
            w.add_tensor(p + "ffn_up.weight", f32(300, 256).astype(np.float16))  # 153,600 bytes
        w.add_tensor("output_norm.weight", f32(3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[dict[str, object]]:
    return [{"name": p.name, "size": p.stat().st_size, "sha256": sha256(p)} for p in sorted(folder.iterdir())]


def record(tool: Path) -> dict[str, object]:
    version = subprocess.run([str(tool), "--version"], capture_output=True, text=True)
    meta: dict[str, object] = {
        "tool": "llama-gguf-split of vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist "
                "(tests/bench/llamacpp_build.py)",
        "tool_version": (version.stderr + version.stdout).strip().splitlines()[:1],
        "gguf_py": __import__("importlib.metadata").metadata.version("gguf"),
        "models": {}, "cases": {},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.gguf"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for m in MODELS:
            src = write_source(m, t / f"{m}.gguf")
            meta["models"][m] = {"size": src.stat().st_size, "sha256": sha256(src)}  # type: ignore[index]
        shutil.copy(t / "small.gguf", OUT / "small.gguf")
        for case, model, args, merge in CASES:
            d = t / case
            d.mkdir()
            run = subprocess.run([str(tool), *args, str(t / f"{model}.gguf"), str(d / model)], capture_output=True,
                                 text=True, check=True)
            plan = [ln for ln in run.stdout.splitlines() if ln.startswith(("n_split", "split "))]
            entry: dict[str, object] = {"model": model, "args": list(args), "plan": plan, "split": _files(d)}
            if merge:
                first = sorted(d.iterdir())[0]
                m_dir = t / f"{case}-merged"
                m_dir.mkdir()
                subprocess.run([str(tool), "--merge", str(first), str(m_dir / f"{model}-merged.gguf")],
                               capture_output=True, check=True)
                entry["merged"] = _files(m_dir)
                if case == COMMITTED:
                    shutil.copy(m_dir / f"{model}-merged.gguf", OUT / f"{model}-merged.gguf")
            if case == COMMITTED:
                for p in d.iterdir():
                    shutil.copy(p, OUT / p.name)
            meta["cases"][case] = entry  # type: ignore[index]
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-build", type=Path, help="llama.cpp bin folder (default: tests/bench/llamacpp_build.py's)")
    a = ap.parse_args()
    if a.llama_build is None:
        sys.path.insert(0, str(HERE / "bench"))
        import llamacpp_build

        a.llama_build = llamacpp_build.cache_root() / "build" / "bin"
    tool = a.llama_build / "llama-gguf-split"
    if not tool.is_file():
        sys.exit(f"{tool} is missing: build it with tests/bench/llamacpp_build.py")
    meta = record(tool)
    for case, e in meta["cases"].items():  # type: ignore[union-attr]
        print(case, len(e["split"]), "files")


if __name__ == "__main__":
    main()
