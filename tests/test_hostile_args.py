"""Hostile templates, vocabularies and arguments (issue 12, items 4 and 5): each ends in a typed exception in core
and one ``quantscope: error: …`` line with a non-zero exit status from the CLI, never a traceback or a hang."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time

import pytest

from quantscope.cli import main as cli
from quantscope.core.chat import ChatTemplate, ChatTemplateBudgetError, ChatTemplateError, RenderBudget
from quantscope.core.gguf import GGUFFile
from quantscope.core.tokenizer import BYTE, CONTROL, NORMAL, Tokenizer, TokenizerError

from .hostile_files import V, spm_vocab, vocab_only, vocab_with, with_template

MSGS = [{"role": "user", "content": "hi"}]
NESTED = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"


def run(capsys, *argv, stdin: str | None = None, monkeypatch=None):
    """``main(argv)`` in-process: (exit status, stdout, stderr)."""
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    """The single ``quantscope: error:`` line of stderr (other stderr lines are progress/status, never a trace)."""
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("quantscope: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------------- template guard
@pytest.mark.parametrize("source, message", [
    (NESTED, "more than 1,000,000 steps"),
    ("{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
     "a string of 33,554,432 characters"),
    ("{% for i in range(100000) %}{% set y %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endset %}"
     "{% endfor %}", "steps"),
    ("{{ 'x' * 1000000000 }}", "a repetition of 1,000,000,000 characters"),
    ("{{ 2 ** 100000000 }}", "2 ** 100000000 is too large"),
    ("{{ 'x'.ljust(1000000000) }}", "ljust() width"),
    ("{{ '%0999999999d' % 1 }}", "a % format width"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion too deep"),
])
def test_template_budget_stops_bombs(source, message):
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateBudgetError, match="template exceeded its budget: .*" + re.escape(message)):
        ChatTemplate(source).render(MSGS)
    # the budget counts steps and sizes (the figure is in the message), not seconds: the bound is a hang guard
    assert time.monotonic() - t0 < 120


def test_template_time_and_output_budgets():
    with pytest.raises(ChatTemplateBudgetError, match=r"more than 0.05 s"):
        ChatTemplate(NESTED, budget=RenderBudget(steps=10**12, seconds=0.05)).render(MSGS)
    with pytest.raises(ChatTemplateBudgetError, match="the output of 101 characters"):
        ChatTemplate("{% for i in range(200) %}x{% endfor %}", budget=RenderBudget(chars=100)).render(MSGS)
    ok = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ '!' if loop.last }}{% endfor %}"
    assert ChatTemplate(ok).render(MSGS * 3) == "<|user|>hi<|user|>hi<|user|>hi!"


def test_template_compile_and_render_errors_are_typed():
    with pytest.raises(ChatTemplateError, match="chat template does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        ChatTemplate("{{ 1 / 0 }}").render(MSGS)
    with pytest.raises(ChatTemplateError, match=r"^no system role$"):
        ChatTemplate("{{ raise_exception('no system role') }}").render(MSGS)


# ---------------------------------------------------------------------------------------------- tokenizer
@pytest.fixture(scope="module")
def smol(model_path):
    return model_path("smollm2")


def test_vocab_only_file_tokenizes(smol, tmp_path, capsys):
    p = vocab_only(tmp_path / "v.gguf", smol)
    with GGUFFile(p) as f:
        assert Tokenizer(f).encode("Hello world") == [19556, 905]
    rc, out, err = run(capsys, "tokenize", p, "Hello world", "--ids")
    assert (rc, out.strip(), err) == (0, "19556 905", "")


@pytest.mark.parametrize("key, value, vtype, sub, message", [
    ("tokenizer.ggml.token_type", [1, 1, 1], V.ARRAY, V.INT32,
     "tokenizer.ggml.token_type has 3 entries but tokenizer.ggml.tokens has 49152"),
    ("tokenizer.ggml.token_type", "normal", V.STRING, None, "tokenizer.ggml.token_type is not a numeric array"),
    ("tokenizer.ggml.tokens", [1, 2, 3], V.ARRAY, V.UINT32, "tokenizer.ggml.tokens is not an array of strings"),
    ("tokenizer.ggml.merges", 5, V.UINT32, None, "tokenizer.ggml.merges is not an array of strings"),
    ("tokenizer.ggml.pre", 3, V.UINT8, None, "tokenizer.ggml.pre is not a string (an integer (3))"),
    ("tokenizer.ggml.tokens", 5, V.UINT32, None, "tokenizer.ggml.tokens is not an array of strings (an integer (5))"),
    ("tokenizer.ggml.token_type", 1.5, V.FLOAT32, None, "tokenizer.ggml.token_type is not a numeric array (a float"),
])
def test_malformed_vocab_metadata_names_the_key(smol, tmp_path, capsys, key, value, vtype, sub, message):
    p = vocab_with(tmp_path / "v.gguf", smol, **{key.replace(".", "__"): (value, vtype, sub)})
    with GGUFFile(p) as f, pytest.raises(TokenizerError, match=re.escape(message)):
        Tokenizer(f)
    before = p.read_bytes()
    rc, out, err = run(capsys, "tokenize", p, "hi")
    assert rc == 2 and out == ""
    assert message in one_error_line(err)
    assert p.read_bytes() == before


@pytest.mark.parametrize("value, vtype, problem", [
    ("1", V.STRING, "tokenizer.ggml.bos_token_id is not an integer (a string ('1')); ignored"),
    (-1, V.INT32, "tokenizer.ggml.bos_token_id = -1 is outside the vocabulary (0..49151); ignored"),
    (10**9, V.UINT32, "tokenizer.ggml.bos_token_id = 1000000000 is outside the vocabulary (0..49151); ignored"),
])
def test_bad_special_ids_are_absent(smol, tmp_path, capsys, value, vtype, problem):
    p = vocab_with(tmp_path / "v.gguf", smol, tokenizer__ggml__bos_token_id=(value, vtype, None),
                   tokenizer__ggml__add_bos_token=(True, V.BOOL, None))
    with GGUFFile(p) as f:
        tok = Tokenizer(f)
    assert tok.bos_id is None and tok.problems == [problem]
    assert tok.encode("Hello") == [19556]  # no BOS, and never pieces[-1]
    rc, out, _err = run(capsys, "tokenize", p, "Hello", "--pieces")
    assert rc == 0 and out.strip() == "'Hello'"
    last = tok.pieces[-1]
    assert repr(last) not in out


def test_invalid_byte_token_is_a_normal_piece(tmp_path, capsys):
    pieces = ["<unk>", "<s>", "</s>", "<0xZZ>", "<0x41>", "▁", "a", "▁a"]
    types = [2, CONTROL, CONTROL, BYTE, BYTE, NORMAL, NORMAL, NORMAL]
    p = spm_vocab(tmp_path / "spm.gguf", pieces, types)
    with GGUFFile(p) as f:
        tok = Tokenizer(f)
    assert tok.byte_ids == {0x41: 4}
    assert tok.token_bytes(3) == b"<0xZZ>" and tok.token_bytes(4) == b"A"
    assert tok.encode("a A") == [1, 7, 5, 4]
    assert tok.token_bytes(10**6) == b""  # an id past the vocabulary (an embedding row without a piece)
    rc, out, err = run(capsys, "tokenize", p, "A", "--pieces")
    assert (rc, out, err) == (0, "'<s>' '▁' '<0x41>'\n", "")


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("args, message", [
    (["--temp", "nan"], "argument --temp: 'nan' is not a finite number"),
    (["--temp", "-1"], "argument --temp: -1 is out of range [0, inf]"),
    (["--seed", "-2"], "argument --seed: -2 is out of range (at least -1)"),
    (["-c", "-5"], "argument -c/--ctx: -5 is out of range (1..16,777,216)"),
    (["-c", "0"], "argument -c/--ctx: 0 is out of range"),
    (["-n", "0"], "argument -n/--n-predict: 0 is out of range (at least 1)"),
    (["--top-p", "2"], "argument --top-p: 2 is out of range [0, 1]"),
    (["--min-p", "inf"], "argument --min-p: 'inf' is not a finite number"),
    (["--top-k", "-3"], "argument --top-k: -3 is out of range (at least 0)"),
    (["--repeat-penalty", "0"], "argument --repeat-penalty: 0 is out of range (0, inf]"),
    (["-t", "-1"], "argument -t/--threads: -1 is out of range (0..1,024)"),
    (["--temp", "warm"], "argument --temp: 'warm' is not a number"),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_bad_sampling_arguments(capsys, tmp_path, command, args, message):
    model = tmp_path / "never-opened.gguf"
    extra = ["-p", "hi"] if command == "generate" else []
    rc, out, err = run(capsys, command, model, *extra, *args)
    assert rc == 2 and out == ""
    line = one_error_line(err)
    assert line.startswith(f"quantscope: error: {command}: ") and message in line
    assert len(err.splitlines()) == 1
    assert not model.exists()


def test_other_bad_arguments_are_one_line(capsys):
    for argv, message in ((["perplexity", "m.gguf", "-f", "t.txt", "-c", "1"], "-c/--ctx: 1 is out of range"),
                          (["bench", "model", "m.gguf", "-r", "0"], "--repetitions: 0 is out of range"),
                          (["generate"], "the following arguments are required: file"),
                          (["inspect", "--items", "x"], "invalid int value: 'x'")):
        rc, _out, err = run(capsys, *argv)
        assert rc == 2 and message in one_error_line(err)


# ---------------------------------------------------------------------------------------------- generate / chat
def test_generate_empty_prompt_starts_from_bos(smol, capsys):
    rc, out, err = run(capsys, "generate", smol, "-p", "", "-n", "3", "--temp", "0", "--seed", "-1")
    assert rc == 0 and "Traceback" not in err
    assert "[1 prompt tokens" in err and "generated" in err
    assert out.endswith("\n") and len(out) > 1


def test_generate_empty_prompt_without_bos_is_an_error(smol, tmp_path, capsys, monkeypatch):
    from quantscope.core.engine.generate import EmptyPrompt, Engine

    eng = Engine(smol, n_ctx=64)
    monkeypatch.setattr(eng.tokenizer, "bos_id", None)
    with pytest.raises(EmptyPrompt, match="the prompt is empty and the vocabulary has no BOS token"):
        list(eng.generate("", None))


def test_prompt_longer_than_the_context(smol, capsys):
    rc, out, err = run(capsys, "generate", smol, "-p", "hello world how are you today", "-c", "4", "-n", "2")
    assert rc == 2 and out == ""
    assert one_error_line(err) == ("quantscope: error: the prompt has 6 tokens but the context holds 4; shorten "
                                   "the conversation or raise the context size")


def test_generate_needs_no_template_chat_says_it_does_not_compile(smol, tmp_path, capsys, monkeypatch):
    bad = with_template(smol, tmp_path / "bad-template.gguf", "{% for %}")
    rc, out, err = run(capsys, "generate", bad, "-p", "The capital of France is", "-n", "2", "--temp", "0")
    assert rc == 0 and out.strip() and "Traceback" not in err
    rc, out, err = run(capsys, "chat", bad, stdin="hello\n", monkeypatch=monkeypatch)
    assert rc == 2 and out == ""
    assert one_error_line(err).startswith(f"quantscope: error: {bad}: chat template does not compile: ")


@pytest.mark.parametrize("template, message", [
    (NESTED, "template exceeded its budget: more than 1,000,000 steps"),
    ("{{ raise_exception('this template refuses everything') }}", "this template refuses everything"),
    ("{{ messages[5]['content'] + 1 }}", "chat template failed"),
])
def test_chat_template_failures_end_cleanly(smol, tmp_path, capsys, monkeypatch, template, message):
    p = with_template(smol, tmp_path / "t.gguf", template)
    t0 = time.monotonic()
    rc, out, err = run(capsys, "chat", p, stdin="hello\n", monkeypatch=monkeypatch)
    assert time.monotonic() - t0 < 120  # a hang guard: the budget counts steps, not seconds
    assert rc == 2 and out == "> "  # the prompt, then nothing
    assert message in one_error_line(err)


def test_chat_past_the_context_drops_the_oldest_turns(smol, capsys, monkeypatch):
    lines = "".join(f"Tell me a fact about the number {i}, please, in one sentence.\n" for i in range(6))
    rc, _out, err = run(capsys, "chat", smol, "-c", "128", "-n", "8", "--temp", "0", stdin=lines,
                       monkeypatch=monkeypatch)
    assert rc == 0 and "Traceback" not in err and "quantscope: error" not in err
    assert "oldest messages are left out: the conversation outgrew the context" in err
    assert err.count("tokens,") == 6  # every turn answered


def test_chat_message_longer_than_the_context(smol, capsys, monkeypatch):
    rc, _out, err = run(capsys, "chat", smol, "-c", "64", "-n", "8", stdin="word " * 200 + "\n",
                       monkeypatch=monkeypatch)
    assert rc == 2
    line = one_error_line(err)
    assert "the last message alone needs" in line and "but the context holds 64 and 8 are kept for the reply" in line


def test_stdin_prompt_that_is_not_utf8(smol, capsys, monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO(b"caf\xe9 \xff\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    rc, _out, err = run(capsys, "generate", smol)
    assert rc == 2 and "the prompt on standard input is not UTF-8 text" in one_error_line(err)


# ---------------------------------------------------------------------------------------------- safety net
def test_unexpected_exception_is_one_line(capsys, monkeypatch, tmp_path):
    def boom(_args):
        raise RuntimeError("something\nbroke")

    from quantscope.cli import install

    monkeypatch.setattr(install, "cmd_models", boom)
    monkeypatch.delenv("QUANTSCOPE_DEBUG", raising=False)
    rc, out, err = run(capsys, "models", "list")
    assert rc == 1 and out == ""
    assert err == "quantscope: error: internal error: RuntimeError: something broke\n"
    monkeypatch.setenv("QUANTSCOPE_DEBUG", "1")
    rc, _out, err = run(capsys, "models", "list")
    assert rc == 1 and "Traceback" in err and err.endswith("internal error: RuntimeError: something broke\n")


def test_console_script_reports_bad_arguments_without_traceback(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "quantscope")
    res = subprocess.run([exe, "generate", str(tmp_path / "x.gguf"), "-p", "hi", "--temp", "nan"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("quantscope: error: generate: argument --temp: 'nan' is not a finite number "
                          "(see quantscope generate --help)\n")


def test_scores_shorter_than_tokens(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "short.gguf"), "llama")
    w.add_key_value("tokenizer.ggml.model", "llama", V.STRING)
    w.add_key_value("tokenizer.ggml.tokens", ["<unk>", "<s>", "a"], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("tokenizer.ggml.scores", [0.0, 1.0], V.ARRAY, sub_type=V.FLOAT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(tmp_path / "short.gguf") as f, pytest.raises(
            TokenizerError, match=r"tokenizer\.ggml\.scores has 2 entries but tokenizer\.ggml\.tokens has 3"):
        Tokenizer(f)
