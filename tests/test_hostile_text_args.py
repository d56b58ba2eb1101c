"""Arguments a user types, checked once (issue 33, items 7 and 8 of the internal errors): regular expressions run
within a time budget, non-UTF-8 text arguments refused in one line (file names may be any bytes), numbers too
long for Python's int conversion or JSON nested too deeply refused by ``edit``, the repeat penalty computed
without overflow, and an unknown option pointing at the verb's own help."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantscope.cli.main import main
from quantscope.core import userregex
from quantscope.core.userregex import RegexTimeout, UserPattern

CLI = [sys.executable, "-m", "quantscope.cli"]


def run_cli(*args: str | bytes | Path, timeout: float = 120, warnings: str = "ignore") -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *(a if isinstance(a, bytes) else str(a) for a in args)], capture_output=True,
                          timeout=timeout, env={**os.environ, "PYTHONWARNINGS": warnings})


def one_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    lines = err.splitlines()
    assert proc.returncode == 2, (proc.returncode, err)
    assert len(lines) == 1 and lines[0].startswith("quantscope: error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --------------------------------------------------------------------------------------------- item 11: regexes
NESTED = "^([a-z0-9_.]+)+X"


def test_the_nested_tensor_type_regex_answers_at_once(model_path) -> None:
    """`^([a-z0-9_.]+)+X` took 40 s on SmolLM2's names with Python's re; the bound here is a hang guard (the
    pattern's own 1 s budget, which ``re`` could not enforce, answers for the engine: exit 0 means it held)."""
    r = run_cli("quantize", model_path("smollm2"), "Q8_0", "--dry-run", "--allow-requantize", "--tensor-type",
                f"{NESTED}=Q8_0", timeout=120)
    assert r.returncode == 0, r.stderr


def test_user_patterns_run_within_a_budget() -> None:
    assert UserPattern("attn_q", "--tensor").search("blk.0.attn_q.weight") is not None
    with pytest.raises(ValueError, match=r"--tensor-type 'a\(' is not a regular expression"):
        UserPattern("a(", "--tensor-type")
    p = UserPattern(NESTED, "--tensor-type", budget_s=0.0)
    with pytest.raises(RegexTimeout, match="takes too long"):
        p.search("blk.0.attn_q.weight")


@pytest.mark.parametrize("pattern", ["a{100000000}", "(a{1000}){1000}", "((ab){100}){100}x{2,5000}", "a{1001,}",
                                     "a" * 5000, "b{" + "9" * 5000 + "}"])
def test_patterns_that_compile_into_too_much_are_refused(pattern: str) -> None:
    """The budget covers matching, not compiling: fixed repetitions unroll (``a{100000000}`` took tens of GB)."""
    with pytest.raises(ValueError, match=r"--tensor-type .*(repetition|characters)") as exc:
        UserPattern(pattern, "--tensor-type")
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 300


@pytest.mark.parametrize("pattern", ["a{1000}", r"blk\.\d{1,3}\.(attn_[qkv]|ffn_(up|down)){1}", r"x\{100000\}",
                                     "[{]100000}", r"\p{L}{3}", "(a{10}){100}", "q{}", "a{,50}"])
def test_patterns_of_reasonable_size_compile(pattern: str) -> None:
    UserPattern(pattern, "--tensor-type")


def test_a_huge_tensor_type_repetition_is_one_line(model_path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("attn_q=Q8_0\na{100000000}=Q8_0\n")
    m = str(model_path("smollm2"))
    quantize = ["quantize", m, "Q8_0", "--dry-run", "--allow-requantize"]
    for argv in ([*quantize, "--tensor-type", "a{100000000}=Q8_0"], [*quantize, "--tensor-type-file", str(rules)],
                 ["diff", m, m, "--tensor", "a{100000000}", "--no-values"]):
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("quantscope: error: ") and "repetition" in err[0], err
        assert "internal error" not in err[0]


@pytest.mark.parametrize("verb", [
    ["quantize", "{m}", "Q8_0", "--dry-run", "--allow-requantize", "--tensor-type", "attn=Q8_0"],
    ["quant-stats", "{m}", "--tensor", "attn_q", "--types", "Q8_0", "--max-rows", "1"],
    ["diff", "{m}", "{m}", "--tensor", "attn_q", "--no-values"],
])
def test_a_regex_past_its_budget_is_one_line(verb: list[str], model_path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(userregex, "BUDGET_S", 0.0)
    rc = main([a.format(m=model_path("smollm2")) for a in verb])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "takes too long" in err[0] and "internal error" not in err[0], err


# --------------------------------------------------------------------------------------------- non-UTF-8 text
@pytest.mark.parametrize("argv", [
    ["tokenize", "{m}", b"caf\xe9"],
    ["generate", "{m}", "-p", b"\xff\xfe", "-n", "1"],
    ["probe", "{m}", "-p", b"x\xff"],
    ["edit", "{m}", "--special-token", b"bos=\xff", "--dry-run"],
    ["edit", "{m}", "--set", b"general.name=\xff", "--dry-run"],
    ["generate", "{m}", "-p", "hi", "--stop", b"\xff"],
    ["chat", "{m}", "--system", b"\xfe"],
])
def test_non_utf8_text_arguments_are_one_line(argv: list, model_path) -> None:
    m = str(model_path("smollm2"))
    r = run_cli(*(a.format(m=m) if isinstance(a, str) else a for a in argv))
    one_error(r, "is not UTF-8 text")


def test_a_non_utf8_file_name_is_still_a_file(model_path, tmp_path: Path) -> None:
    odd = os.fsencode(tmp_path) + b"/m\xff.gguf"
    shutil.copyfile(model_path("smollm2"), odd)
    r = run_cli("inspect", odd)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
    r = run_cli("export", odd, "--metadata", "-o", os.fsencode(tmp_path) + b"/meta\xfe.json")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(os.fsencode(tmp_path))) == sorted([b"m\xff.gguf", b"meta\xfe.json"])


# --------------------------------------------------------------------------------------------- edit's numbers
@pytest.mark.parametrize("edit, needle", [
    ("--set-typed=x=ARRAY[INT32]:" + "[" * 5000 + "]" * 5000, "nested too deeply"),
    ("--set-typed=x=INT64:" + "9" * 5000, "5,000 digits"),
    ("--set-typed=x=ARRAY[INT64]:[" + "9" * 5000 + "]", "JSON list"),
    ("--special-token=bos=" + "9" * 5000, "no token"),
])
def test_edit_refuses_huge_numbers_and_deep_json_in_one_line(edit: str, needle: str, model_path) -> None:
    one_error(run_cli("edit", model_path("smollm2"), edit, "--dry-run"), needle)


# ------------------------------------------------------------------------------------------ the rest of item 8
def test_an_unknown_option_points_at_the_verbs_help(tmp_path: Path) -> None:
    one_error(run_cli("quantize", tmp_path / "a.gguf", tmp_path / "b.gguf", "Q8_0", "-t"),
              "unrecognized arguments: -t", "see quantscope quantize --help")


def test_a_tiny_repeat_penalty_prints_no_numpy_warning(model_path) -> None:
    r = run_cli("generate", model_path("smollm2"), "-p", "hello hello hello", "-n", "2", "--alternatives", "3",
                "--repeat-penalty", "1e-45", "-t", "2", warnings="default")
    assert r.returncode == 0, r.stderr
    assert b"Warning" not in r.stderr, r.stderr
