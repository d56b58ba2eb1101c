"""Record llama.cpp's embeddings of the BERT fixtures (tests/bert_fixtures.py) into tests/data/bert/meta.json.

For every variant and pooling asked of it (the file's own, and overrides), ``llama-embedding`` embeds
:data:`bert_fixtures.TEXTS` (one line each, ``--embd-normalize 2``, JSON array output); its ``--verbose-prompt``
token ids are stored too. The reranker (``bert-rank``) goes to tests/data/bert/rank.json instead: llama-embedding
``--pooling rank`` scores :data:`bert_fixtures.PAIRS` (``query<TAB>document`` lines, ``--embd-normalize -1``: its
normalisation would run over n_embd values of a one-value score), with flash attention as it defaults and off.
llama-embedding is an example program, outside the tools ``tests/bench/llamacpp_build.py``
builds: it is compiled here from the same tree against that build's static libraries (``--llama-dir``, default
the cache's llama.cpp-0.3.36). Usage:

    python tests/record_bert_fixtures.py [--llama-dir DIR] [--only NAME[,NAME...]]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.llamacpp_build import VERSION, cache_root
from bert_fixtures import PAIRS, TEXTS, VARIANTS, write_fixture

DATA = Path(__file__).resolve().parent / "data" / "bert"
#: the poolings recorded per variant: the file's own first (None), then overrides
POOLINGS = {"bert-mean": (None, "cls", "none"), "bert-cls": (None, "mean"), "bert-mean-q8": (None, "cls", "none"),
            "nomic-mean": (None, "cls", "none"), "nomic-cls-q8": (None, "mean", "none"),
            "jina-mean": (None, "cls", "none"), "jina-cls-split": (None, "mean")}
#: the rerankers, recorded by :func:`run_rank`
RANKERS = ("bert-rank",)


def build_embedding(root: Path, out: Path, source: Path | None = None) -> Path:
    """Compile examples/embedding/embedding.cpp (or ``source``, a copy of it) against ``root``'s build (static
    libraries, CPU only)."""
    src, build = root / "src", root / "build"
    exe = out / "llama-embedding"
    libs = ["common/libllama-common.a", "src/libllama.a", "ggml/src/libggml.a", "-ldl", "ggml/src/libggml-cpu.a",
            "ggml/src/libggml-base.a", "-lm", "-fopenmp", "-lpthread", "common/libllama-common-base.a",
            "vendor/cpp-httplib/libcpp-httplib.a", "-lssl", "-lcrypto"]
    source = source or src / "examples/embedding/embedding.cpp"
    cmd = ["c++", "-O2", "-DNDEBUG", "-DGGML_USE_CPU", f"-I{src / 'common'}", f"-I{src / 'vendor'}",
           f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", str(source), "-o", str(exe),
           *[str(build / x) if x.endswith(".a") else x for x in libs]]
    subprocess.run(cmd, check=True)
    return exe


def run(exe: Path, model: Path, pooling: str | None,
        texts: tuple[str, ...] = TEXTS) -> tuple[list[list[float]], list[list[int]]]:
    """llama-embedding's vectors (one per text, or per token with ``none``) and the token ids of each text."""
    cmd = [str(exe), "-m", str(model), "-p", "\n".join(texts), "--embd-normalize", "2", "--embd-output-format",
           "array", "-t", "1", "--verbose-prompt"]
    if pooling:
        cmd += ["--pooling", pooling]
    # llama.cpp's logger writes from its own thread and the program may exit before it has written the array's
    # tail: run again until the array is whole
    for _ in range(20):
        with tempfile.TemporaryFile("w+", encoding="utf-8") as fh:
            subprocess.run(cmd, stdout=fh, stderr=subprocess.PIPE, text=True, check=True)
            fh.seek(0)
            out = fh.read()
        start = out.rindex("[[")  # the verbose prompt comes first, the array last
        try:
            vecs = json.loads(out[start:].strip())
        except json.JSONDecodeError:
            continue
        blocks = re.split(r"\n\s*\n", out[:start])  # each prompt's "  id -> 'piece'" lines, a blank line after
        ids = [[int(m.group(1)) for m in re.finditer(r"^\s*(\d+) -> '", b, re.M)] for b in blocks]
        return vecs, [x for x in ids if x]
    raise RuntimeError(f"llama-embedding never wrote a whole array: {' '.join(cmd)}")


def run_rank(exe: Path, model: Path, *extra: str) -> tuple[list[float], list[list[int]]]:
    """llama-embedding's rerank score of each of :data:`PAIRS` and the token ids of each pair. Its array holds
    n_embd values per pair, of which only the first (n_cls_out = 1) is the score: the rest are read past the
    one-value result (llama.cpp 0.3.36's embedding.cpp), so they are dropped."""
    cmd = [str(exe), "-m", str(model), "-p", "\n".join(f"{q}\t{d}" for q, d in PAIRS), "--pooling", "rank",
           "--embd-normalize", "-1", "--embd-output-format", "array", "-t", "1", "--verbose-prompt", *extra]
    for _ in range(20):
        with tempfile.TemporaryFile("w+", encoding="utf-8") as fh:
            subprocess.run(cmd, stdout=fh, stderr=subprocess.PIPE, text=True, check=True)
            fh.seek(0)
            out = fh.read()
        start = out.rindex("[[")
        array = out[start:].strip()
        # the values read past the score may be nan or inf, which JSON does not parse: take each row's first
        scores = [float(x) for x in re.findall(r"\[(-?\d+\.\d+)[,\]]", array)]
        if not array.endswith("]]") or len(scores) != len(PAIRS):
            continue
        blocks = re.split(r"\n\s*\n", out[:start])
        ids = [[int(m.group(1)) for m in re.finditer(r"^\s*(\d+) -> '", b, re.M)] for b in blocks]
        return scores, [x for x in ids if x]
    raise RuntimeError(f"llama-embedding never wrote a whole array: {' '.join(cmd)}")


def record_rankers(exe: Path, tmp: Path, only: str | None) -> None:
    path = DATA / "rank.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    for name in RANKERS:
        if only and name != only:
            continue
        model = write_fixture(name, tmp / f"{name}.gguf")
        scores, ids = run_rank(exe, model)
        scores_fa_off, _ = run_rank(exe, model, "-fa", "off")
        meta[name] = {"sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "llama_cpp": VERSION,
                      "pairs": [list(p) for p in PAIRS], "tokens": ids,
                      "runs": {"file": scores, "fa-off": scores_fa_off}}
        print(f"{name}: scores {scores}")
    path.write_text(json.dumps(meta, indent=0) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-dir", type=Path, default=cache_root(VERSION))
    ap.add_argument("--only", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    meta_path = DATA / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_embedding(args.llama_dir, Path(tmp))
        record_rankers(exe, Path(tmp), args.only)
        for name in VARIANTS:
            if args.only and name not in args.only.split(","):
                continue
            path = write_fixture(name, Path(tmp) / f"{name}.gguf")
            entry: dict[str, object] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                                        "llama_cpp": VERSION, "texts": list(TEXTS), "runs": {}}
            for pooling in POOLINGS[name]:
                vecs, ids = run(exe, path, pooling)
                entry["tokens"] = ids
                entry["runs"][pooling or "file"] = vecs  # type: ignore[index]
                print(f"{name} {pooling or 'file'}: {len(vecs)} vectors of {len(vecs[0])}")
            meta[name] = entry
    meta_path.write_text(json.dumps(meta, indent=0) + "\n")


if __name__ == "__main__":
    main()
