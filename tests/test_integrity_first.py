"""Integrity first (issue 34): a file whose tensors run past its end (truncated after an intact header), overlap or
are misaligned says so before anything else, in the core summary and ``quantscope inspect``, and the figures that
cannot be right are not given (a type's share of the file, padding "after the last tensor")."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

from quantscope.cli.main import main as cli_main
from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf.checks import integrity_checks, layout_problems
from quantscope.core.summary import render_text, summarize


def sound_file(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("integrity")
    rng = np.random.default_rng(3)
    for i in range(4):
        w.add_tensor(f"blk.{i}.ffn_down.weight", rng.standard_normal((64, 256)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def truncated_file(path: Path) -> Path:
    """Cut in the second tensor: the header is intact, three tensors run past the end."""
    sound_file(path)
    with GGUFFile(path) as f:
        cut = f.tensors[1].data_offset + 100
    os.truncate(path, cut)
    return path


def test_a_sound_file_has_no_layout_problem_and_its_shares_add_up(tmp_path):
    with GGUFFile(sound_file(tmp_path / "ok.gguf")) as f:
        assert layout_problems(f) == []
        s = summarize(f)
        assert s["integrity"] == []
        assert 0.9 < sum(r["share"] for r in s["types"]) <= 1.0
        assert "INTEGRITY" not in render_text(f, s)


def test_a_truncated_file_says_so_first_and_gives_no_impossible_figure(tmp_path):
    with GGUFFile(truncated_file(tmp_path / "cut.gguf"), strict=False) as f:
        problems = layout_problems(f)
        assert len(problems) == 1 and problems[0].startswith("3 tensors of 4 run past the end of the file")
        s = summarize(f)
        assert s["integrity"] == problems
        assert all(r["share"] is None for r in s["types"])  # 4 tensors' bytes over a file that holds 1.x
        text = render_text(f, s).splitlines()
        assert text[2].startswith("INTEGRITY   3 tensors of 4 run past the end")  # right after File and Size
        by_type = text[text.index("By type") + 2]
        assert "%" not in by_type and by_type.split()[4] == "-"
        padding = next(c for c in integrity_checks(f) if c.name == "padding")
        assert "after the last tensor" not in padding.detail and "not measured" in padding.detail


def test_inspect_prints_the_integrity_line_before_the_rest(tmp_path, capsys):
    path = truncated_file(tmp_path / "cut.gguf")
    assert cli_main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("INTEGRITY   3 tensors of 4 run past the end of the file")
