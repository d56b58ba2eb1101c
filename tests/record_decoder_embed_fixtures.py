"""Record llama.cpp's embeddings of the decoder-body fixtures (tests/decoder_embed_fixtures.py: Qwen3-Embedding and
EmbeddingGemma) into tests/data/decoder_embed/meta.json.

As tests/record_bert_fixtures.py (whose llama-embedding build and run this reuses): for every variant and pooling
asked of it (the file's own, then overrides), ``llama-embedding`` embeds :data:`decoder_embed_fixtures.TEXTS`
(``--embd-normalize 2``) and its ``--verbose-prompt`` token ids are stored. llama-embedding prints through
llama.cpp's logger thread, which lost the array's tail on every run of these fixtures (the program exits first):
it is compiled from a copy of the example whose ``LOG`` (the output, not the log lines) is a plain ``printf``;
the numbers are llama.cpp's own. The rerankers (:data:`decoder_embed_fixtures.RANKERS`, Qwen3-Reranker) go to
tests/data/decoder_embed/rank.json: llama-embedding with the file's rank pooling scores
:data:`decoder_embed_fixtures.PAIRS` (``query<TAB>document`` lines, which it fills into the file's rerank template;
``--embd-normalize -1``), with flash attention as it defaults and off. Usage:

    python tests/record_decoder_embed_fixtures.py [--llama-dir DIR] [--exe LLAMA_EMBEDDING] [--only NAME]
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llamacpp_build import VERSION, cache_root
from record_bert_fixtures import build_embedding, run

from tests.decoder_embed_fixtures import N_CTX_TRAIN, PAIRS, RANKERS, TEXTS, VARIANTS, write_fixture

DATA = Path(__file__).resolve().parent / "data" / "decoder_embed"
#: the poolings recorded per variant: the file's own first (None), then overrides
POOLINGS = {"qwen3-embed": (None, "mean"), "gemma-embed": (None, "last", "none")}


def synchronous_copy(root: Path, out: Path) -> Path:
    """examples/embedding/embedding.cpp with its output (``LOG``) written by printf, in order, before exit."""
    text = (root / "src" / "examples" / "embedding" / "embedding.cpp").read_text()
    head = '#include "log.h"\n'
    if head not in text:
        raise RuntimeError("examples/embedding/embedding.cpp no longer includes log.h: update this recorder")
    text = text.replace(head, head + "#undef LOG\n#define LOG(...) (printf(__VA_ARGS__), fflush(stdout))\n", 1)
    path = out / "embedding.cpp"
    path.write_text(text)
    return path


def run_rank(exe: Path, model: Path, n_out: int, *extra: str) -> tuple[list[list[float]], list[list[int]]]:
    """llama-embedding's ``n_out`` rank scores of each of :data:`PAIRS` (its array holds n_embd values per pair, of
    which the first ``n_out`` are the head's: the rest are read past the result, so they are dropped) and the
    token ids of each pair."""
    cmd = [str(exe), "-m", str(model), "-p", "\n".join(f"{q}\t{d}" for q, d in PAIRS), "--embd-normalize", "-1",
           "--embd-output-format", "array", "-t", "1", "--verbose-prompt", "-b", str(N_CTX_TRAIN), *extra]
    # (-b: the batch as large as the context llama.cpp clamps to the trained one; with its default 2048 it builds
    # a batch of several pairs past the 256 tokens its batch object holds and aborts)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    start = out.rindex("[[")
    array = out[start:].strip()
    rows = re.findall(r"\[([^\[\]]*)\]", array)
    if not array.endswith("]]") or len(rows) != len(PAIRS):
        raise RuntimeError(f"llama-embedding wrote {len(rows)} rows for {len(PAIRS)} pairs: {' '.join(cmd)}")
    scores = [[float(x) for x in r.split(",")[:n_out]] for r in rows]
    blocks = re.split(r"\n\s*\n", out[:start])
    ids = [[int(m.group(1)) for m in re.finditer(r"^\s*(\d+) -> '", b, re.M)] for b in blocks]
    return scores, [x for x in ids if x]


def record_rankers(exe: Path, tmp: Path, only: str | None) -> None:
    path = DATA / "rank.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    for name in RANKERS:
        if only and name != only:
            continue
        model = write_fixture(name, tmp / f"{name}.gguf")
        scores, ids = run_rank(exe, model, 2)
        scores_fa_off, _ = run_rank(exe, model, 2, "-fa", "off")
        meta[name] = {"sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "llama_cpp": VERSION,
                      "pairs": [list(p) for p in PAIRS], "tokens": ids,
                      "runs": {"file": scores, "fa-off": scores_fa_off}}
        print(f"{name}: scores {scores}")
    path.write_text(json.dumps(meta, indent=0) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-dir", type=Path, default=cache_root(VERSION))
    ap.add_argument("--exe", type=Path, help="a llama-embedding already built against --llama-dir")
    ap.add_argument("--only")
    args = ap.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    meta_path = DATA / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        exe = args.exe or build_embedding(args.llama_dir, Path(tmp), synchronous_copy(args.llama_dir, Path(tmp)))
        record_rankers(exe, Path(tmp), args.only)
        for name in VARIANTS:
            if args.only and name != args.only:
                continue
            path = write_fixture(name, Path(tmp) / f"{name}.gguf")
            entry: dict[str, object] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                                        "llama_cpp": VERSION, "texts": list(TEXTS), "runs": {}}
            for pooling in POOLINGS[name]:
                vecs, ids = run(exe, path, pooling, TEXTS)
                entry["tokens"] = ids
                entry["runs"][pooling or "file"] = vecs  # type: ignore[index]
                print(f"{name} {pooling or 'file'}: {len(vecs)} vectors of {len(vecs[0])}")
            meta[name] = entry
    meta_path.write_text(json.dumps(meta, indent=0) + "\n")


if __name__ == "__main__":
    main()
