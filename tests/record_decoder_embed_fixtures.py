"""Record llama.cpp's embeddings of the decoder-body fixtures (tests/decoder_embed_fixtures.py: Qwen3-Embedding and
EmbeddingGemma) into tests/data/decoder_embed/meta.json.

As tests/record_bert_fixtures.py (whose llama-embedding build and run this reuses): for every variant and pooling
asked of it (the file's own, then overrides), ``llama-embedding`` embeds :data:`decoder_embed_fixtures.TEXTS`
(``--embd-normalize 2``) and its ``--verbose-prompt`` token ids are stored. llama-embedding prints through
llama.cpp's logger thread, which lost the array's tail on every run of these fixtures (the program exits first):
it is compiled from a copy of the example whose ``LOG`` (the output, not the log lines) is a plain ``printf``;
the numbers are llama.cpp's own. Usage:

    python tests/record_decoder_embed_fixtures.py [--llama-dir DIR] [--exe LLAMA_EMBEDDING] [--only NAME]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llamacpp_build import VERSION, cache_root
from record_bert_fixtures import build_embedding, run

from tests.decoder_embed_fixtures import TEXTS, VARIANTS, write_fixture

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
