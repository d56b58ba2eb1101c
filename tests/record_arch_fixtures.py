"""Record llama.cpp's log-probabilities for the architecture fixtures of tests/arch_fixtures.py.

For every fixture (and variant: F32 weights, plus Q8_0 matrices for llama), write it with gguf-py, run
``llama-perplexity -c 64 -b 64 --chunks 4 --kl-divergence-base`` on tests/data/english.txt and keep the file
(gzip) as ``tests/data/arch/NAME-VARIANT.kld.gz``; ``tests/data/arch/meta.json`` records each fixture's SHA-256,
llama-perplexity's perplexity and the llama.cpp it came from. tests/test_arch_fidelity.py rebuilds the fixtures,
checks the hashes and compares our logits with these files.

llama-perplexity comes from ``--llama-bin DIR`` or tests/bench/llamacpp_build.py (built once into ~/.cache).
Usage: python tests/record_arch_fixtures.py [--llama-bin DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

import arch_fixtures  # noqa: E402
import llamacpp_build  # noqa: E402

OUT = HERE / "data" / "arch"
ARGS = ["-c", "64", "-b", "64", "--chunks", "4", "-t", "2"]
VARIANTS = {name: ["F32"] for name in arch_fixtures.SPECS} | {"llama": ["F32", "Q8_0"], "mixtral": ["F32", "Q8_0"],
                                                             "gpt-oss": ["F32", "MXFP4"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", type=Path)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    perplexity = str(Path(a.llama_bin or llamacpp_build.build()) / "llama-perplexity")
    OUT.mkdir(parents=True, exist_ok=True)
    meta_path = OUT / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta["llama.cpp"] = f"vendor/llama.cpp of the llama-cpp-python {llamacpp_build.VERSION} sdist"
    meta["command"] = "llama-perplexity -m FIXTURE -f tests/data/english.txt " + " ".join(ARGS) + \
        " --kl-divergence-base FILE"
    fixtures = meta.setdefault("fixtures", {})
    vocab = arch_fixtures.vocabulary()
    with tempfile.TemporaryDirectory() as tmp:
        for name, variants in VARIANTS.items():
            if a.only and name not in a.only:
                continue
            for variant in variants:
                key = f"{name}-{variant}"
                model = arch_fixtures.write_fixture(name, Path(tmp) / f"{key}.gguf", variant, vocab=vocab)
                base = Path(tmp) / f"{key}.kld"
                # into a file: through a pipe, llama.cpp's asynchronous log loses its last lines at exit
                log = Path(tmp) / f"{key}.log"
                with log.open("w") as out:
                    subprocess.run([perplexity, "-m", str(model), "-f", str(HERE / "data" / "english.txt"), *ARGS,
                                    "--kl-divergence-base", str(base)], stdout=out, stderr=subprocess.STDOUT,
                                   check=True)
                text = log.read_text(errors="replace")
                # the last chunk's running value is the final estimate (whose line the log may still lose)
                ppl = re.search(r"Final estimate: PPL = ([0-9.]+)", text) or re.search(r"\[4\]([0-9.]+),", text)
                with gzip.GzipFile(OUT / f"{key}.kld.gz", "wb", mtime=0) as gz:
                    gz.write(base.read_bytes())
                fixtures[key] = {"arch": name, "variant": variant,
                                 "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                                 "llama_ppl": float(ppl.group(1)) if ppl else None}
                print(key, fixtures[key])
    meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
