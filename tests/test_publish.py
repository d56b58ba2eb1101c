"""`quantscope publish` (cli/publish.py, core/modelcard.py): the model card of a file quantized here with an
importance matrix, --tensor-type rules and a target-size report, read back with huggingface_hub's own ModelCard; and
bad inputs refused in one line. (The upload runs against the hub server of tests/hubserver.py where it serves
commits.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from quantscope.core.gguf.reader import GGUFFile
from quantscope.core.summary import type_summary

from .arch_fixtures import vocabulary, write_fixture

ROOT = Path(__file__).resolve().parents[1]


def qs(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscope.cli", *args], capture_output=True, text=True,
                          check=check)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("publish")
    base = write_fixture("llama", d / "base.gguf", vocab=vocabulary())
    text = d / "text.txt"
    text.write_text((ROOT / "tests" / "data" / "english.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    qs("imatrix", str(base), "-f", str(text), "-c", "64", "-o", str(d / "imatrix.gguf"))
    out = qs("quantize", str(base), str(d / "out.gguf"), "--target-size", "300K", "-f", str(text), "--imatrix",
             str(d / "imatrix.gguf"), "--rules", str(d / "rules.txt"), "--json")
    (d / "report.json").write_text(out.stdout, encoding="utf-8")
    return {"file": d / "out.gguf", "rules": d / "rules.txt", "report": d / "report.json", "dir": d}


def test_the_card_describes_the_file_its_rules_and_figures(quantized):
    q = quantized
    r = qs("publish", str(q["file"]), "me/Tiny-GGUF", "--dry-run", "--base-model", "org/Tiny", "--rules",
           str(q["rules"]), "--report", str(q["report"]), "--card-out", str(q["dir"] / "README.md"))
    assert r.stdout == ""  # the card went to --card-out
    text = (q["dir"] / "README.md").read_text(encoding="utf-8")
    card = ModelCard(text)
    assert card.data.base_model == "org/Tiny" and card.data.quantized_by == "quantscope"
    assert set(card.data.tags) >= {"gguf", "quantscope"}
    with GGUFFile(q["file"]) as f:
        types = type_summary(f)
        assert f.get("quantize.imatrix.file") is not None
        entries = f.get("quantize.imatrix.entries_count")
    for row in types:  # every tensor type with its count and bytes
        assert f"| {row['type']} | {row['tensors']} | {row['bytes']:,} |" in card.text
    assert f"- entries: `{entries}`" in card.text and "imatrix.gguf" in card.text
    rules = q["rules"].read_text(encoding="utf-8").splitlines()
    assert rules and all(line in card.text for line in rules)
    summary = json.loads(q["report"].read_text(encoding="utf-8"))["summary"]
    assert f"| Predicted mean KL divergence | {summary['predicted_kld']:.5f} |" in card.text
    assert "--hf-repo me/Tiny-GGUF --hf-file out.gguf" in card.text
    printed = qs("publish", str(q["file"]), "me/Tiny-GGUF", "--dry-run").stdout  # no options: the header alone
    assert ModelCard(printed).data.tags == ["gguf", "quantscope"] and "Predicted" not in printed


@pytest.mark.parametrize("args, says", [
    (["me/x/y"], "ORG/NAME"),
    (["me/x", "--report", "{report_bad}"], "no summary"),
    (["me/x", "--report", "{rules}"], "not a JSON report"),
    (["me/x", "--rules", "{missing}"], "missing"),
])
def test_bad_inputs_are_refused_in_one_line(quantized, args, says):
    bad = quantized["dir"] / "bad.json"
    bad.write_text('{"summary": 1}', encoding="utf-8")
    subs = {"report_bad": str(bad), "rules": str(quantized["rules"]), "missing": str(quantized["dir"] / "missing")}
    args = [a.format(**subs) for a in args]
    r = qs("publish", str(quantized["file"]), *args, "--dry-run", check=False)
    err = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(err) == 1 and err[0].startswith("quantscope: error:") and says in err[0], r.stderr


def test_the_file_and_its_card_reach_the_hub_in_one_commit(quantized, tmp_path):
    """Against a hub on 127.0.0.1 that takes commits (tests/hub_commits.py), with the real huggingface_hub client:
    the repository is created, the GGUF goes by LFS (its sha256 checked by the server) and the card as README.md,
    in one commit, with the token; a repository the token cannot write is one line."""
    import os

    from .hub_commits import running_hub

    with running_hub() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_test_token",
               "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        r = subprocess.run([sys.executable, "-m", "quantscope.cli", "publish", str(quantized["file"]),
                            "me/Tiny-GGUF", "--report", str(quantized["report"])], capture_output=True, text=True,
                           env=env)
        assert r.returncode == 0, r.stderr
        files = hub.repos["me/Tiny-GGUF"]
        assert files["out.gguf"] == quantized["file"].read_bytes()
        card = ModelCard(files["README.md"].decode("utf-8"))
        assert "quantscope" in card.data.tags and "Predicted mean KL divergence" in card.text
        assert len(hub.commits) == 1 and hub.blobs  # one commit; the GGUF went by LFS
        assert hub.validated[0]["quantized_by"] == "quantscope"  # the client had the hub check the front matter
        assert "Bearer hf_test_token" in hub.tokens
        assert "published out.gguf" in r.stdout and "me/Tiny-GGUF" in r.stdout
        again = subprocess.run([sys.executable, "-m", "quantscope.cli", "publish", str(quantized["file"]),
                                "me/Tiny-GGUF"], capture_output=True, text=True, env=env)
        assert again.returncode == 0 and len(hub.commits) == 2  # the repository exists: a new commit
        denied = subprocess.run([sys.executable, "-m", "quantscope.cli", "publish", str(quantized["file"]),
                                 "me/forbidden"], capture_output=True, text=True, env=env)
        err = denied.stderr.strip().splitlines()
        assert denied.returncode != 0 and len(err) == 1 and err[0].startswith("quantscope: error: the hub refused")
