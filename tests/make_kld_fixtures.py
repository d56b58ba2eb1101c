"""Record the KL-divergence format fixtures of tests/test_kld.py with llama.cpp's llama-perplexity.

Writes into tests/data/kld/:

* ``smollm2-c16-llama.kld.gz``: the log-probability file llama-perplexity wrote for SmolLM2 on the first 3000
  characters of tests/data/english.txt (``-c 16 -b 16 --chunks 1``);
* ``smollm2-c16-ours.kld.gz``: the file ``quantscope perplexity --kl-divergence-base`` wrote for the same input;
* ``meta.json``: the llama.cpp version, the commands, llama-perplexity's perplexity of its own run and what it
  printed when it read our file with ``--kl-divergence`` (its per-chunk line: PPL, ln ratio, KLD, Δp RMS, same top).

llama-perplexity comes from ``--llama-bin DIR`` or tests/bench/llamacpp_build.py (built once into ~/.cache).
Usage: python tests/make_kld_fixtures.py [--llama-bin DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "bench"))

import llamacpp_build  # noqa: E402

from quantscope.core import catalog  # noqa: E402

OUT = HERE / "data" / "kld"
TEXT_CHARS = 3000
ARGS = ["-c", "16", "-b", "16", "--chunks", "1", "-t", "2"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", type=Path)
    a = ap.parse_args()
    bin_dir = a.llama_bin or llamacpp_build.build()
    perplexity = str(Path(bin_dir) / "llama-perplexity")
    model = str(catalog.fetch("smollm2"))
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text((HERE / "data" / "english.txt").read_text(encoding="utf-8")[:TEXT_CHARS], encoding="utf-8")
        theirs, ours = Path(tmp) / "llama.kld", Path(tmp) / "ours.kld"
        run = subprocess.run([perplexity, "-m", model, "-f", str(text), *ARGS, "--kl-divergence-base", str(theirs)],
                             capture_output=True, text=True, check=True)
        ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr).group(1))  # type: ignore[union-attr]
        subprocess.run([sys.executable, "-m", "quantscope.cli", "perplexity", model, "-f", str(text), "-c", "16",
                        "--chunks", "1", "-t", "2", "--kl-divergence-base", str(ours)], check=True)
        read = subprocess.run([perplexity, "-m", model, *ARGS, "--kl-divergence-base", str(ours), "--kl-divergence"],
                              capture_output=True, text=True, check=True)
        rows = [ln.strip() for ln in (read.stdout + read.stderr).splitlines() if re.match(r"^\s+\d+\s+\d", ln)]
        for src, name in ((theirs, "smollm2-c16-llama.kld.gz"), (ours, "smollm2-c16-ours.kld.gz")):
            with gzip.GzipFile(OUT / name, "wb", mtime=0) as gz:
                gz.write(src.read_bytes())
    meta = {
        "llama.cpp": f"vendor/llama.cpp of the llama-cpp-python {llamacpp_build.VERSION} sdist",
        "model": catalog.get_spec("smollm2").filename,
        "text": f"tests/data/english.txt, first {TEXT_CHARS} characters",
        "write": "llama-perplexity -m MODEL -f TEXT " + " ".join(ARGS) + " --kl-divergence-base FILE",
        "llama_ppl": ppl,
        "read_ours": "llama-perplexity -m MODEL " + " ".join(ARGS) + " --kl-divergence-base OURS --kl-divergence",
        "llama_reading_ours_rows": rows,
    }
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
