"""Fill in the middle on the server: ``suffix`` of /v1/completions (the real ``openai`` client) and llama-server's
/infill (``input_prefix``, ``input_suffix``, ``input_extra``, ``prompt``; with httpx) on qwen2.5-coder, whose
prompt must be its FIM layout (checked on the token ids the scheduler got, built here from the vocabulary's own
FIM tokens), and the 400 of a model without FIM tokens (SmolLM2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import openai
import pytest

from quantscope.core.engine.generate import Engine
from quantscope.core.server import Server

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\n\nprint(add(2, 3))\n"


@pytest.fixture(scope="module")
def qwen(model_path: Any) -> Iterator[Server]:
    eng = Engine(model_path("qwen2.5-coder"), n_ctx=1024, threads=1, backend="cpu")
    srv = Server(eng, "qwen", port=0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        eng.close()


def fim_layout(srv: Server, prefix: str, suffix: str, prompt: str = "",
               extra: tuple[tuple[str, str], ...] = ()) -> list[int]:
    """llama-server's format_prompt_infill for Qwen's tokens, spelled out: repo, extra files, the file, then
    prefix, suffix and middle."""
    tok = srv.app.engine.tokenizer
    v = tok.vocab

    def enc(s: str) -> list[int]:
        return tok.encode(s, add_special=False, parse_special=False) if s else []

    ids = [v["<|repo_name|>"], *enc("myproject\n")]
    for name, text in extra:
        ids += [v["<|file_sep|>"], *enc(name + "\n"), *enc(text)]
    ids += [v["<|file_sep|>"], *enc("filename\n")]
    return [*ids, v["<|fim_prefix|>"], *enc(prefix), *enc(prompt), v["<|fim_suffix|>"], *enc(suffix),
            v["<|fim_middle|>"]]


def last_prompt(srv: Server) -> list[int]:
    return srv.app.log.records()[-1].prompt_ids


def test_suffix_fills_the_middle(qwen: Server) -> None:
    c = openai.OpenAI(base_url=qwen.url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = c.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=16)
    text = r.choices[0].text
    assert "return" in text and "a + b" in text.replace("a+b", "a + b"), text
    ids = last_prompt(qwen)
    assert ids == fim_layout(qwen, PREFIX, SUFFIX)
    assert r.usage.prompt_tokens == len(ids)
    # the model's words are not in it as text: the FIM markers are single control tokens
    v = qwen.app.engine.tokenizer.vocab
    assert ids.count(v["<|fim_prefix|>"]) == ids.count(v["<|fim_middle|>"]) == 1
    plain = c.completions.create(model="qwen", prompt=PREFIX, temperature=0, max_tokens=16, suffix="")
    assert last_prompt(qwen) == qwen.app.engine.tokenizer.encode(PREFIX) and plain.choices[0].text


def test_the_middle_ends_at_fim_pad_and_separators(qwen: Server) -> None:
    """As in llama.cpp: FIM_PAD, FIM_REP and FIM_SEP end a middle (forced here by a bias), not a plain completion."""
    c = openai.OpenAI(base_url=qwen.url + "/v1", api_key="none", max_retries=0, timeout=120)
    v = qwen.app.engine.tokenizer.vocab
    for piece in ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>"):
        bias = {str(v[piece]): 100}
        mid = c.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX, max_tokens=4, logit_bias=bias)
        assert mid.choices[0].finish_reason == "stop" and mid.usage.completion_tokens == 0
        plain = c.completions.create(model="qwen", prompt=PREFIX, max_tokens=4, logit_bias=bias)
        assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 4


def test_ollama_generate_suffix(qwen: Server) -> None:
    r = ollama.Client(host=qwen.url, timeout=120).generate(model="qwen", prompt=PREFIX, suffix=SUFFIX,
                                                          options={"temperature": 0, "num_predict": 16})
    assert "return" in r.response
    assert last_prompt(qwen) == fim_layout(qwen, PREFIX, SUFFIX)


def test_infill_endpoint(qwen: Server) -> None:
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra, "prompt": "return",
            "temperature": 0, "n_predict": 12}
    r = httpx.post(qwen.url + "/infill", json=body, timeout=120)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["stop"] is True and d["content"] and "a" in d["content"] and d["tokens_predicted"] > 0
    assert last_prompt(qwen) == fim_layout(qwen, PREFIX, SUFFIX, "return", (("util.py", extra[0]["text"]),))
    assert d["tokens_evaluated"] == len(last_prompt(qwen))
    with httpx.stream("POST", qwen.url + "/infill", json=body | {"stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1]["stop"] is True and not any(e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == d["content"]


@pytest.mark.parametrize(("body", "param"), [
    ({"input_suffix": "x"}, "input_prefix"), ({"input_prefix": "x"}, "input_suffix"),
    ({"input_prefix": 1, "input_suffix": "x"}, "input_prefix"),
    ({"input_prefix": "x", "input_suffix": "y", "input_extra": "z"}, "input_extra"),
    ({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "a"}]}, "input_extra"),
    ({"input_prefix": "x", "input_suffix": "y", "prompt": 3}, "prompt"),
    ({"input_prefix": "x", "input_suffix": "y", "n": 2}, "n"),
    ({"input_prefix": "x", "input_suffix": "y", "presence_penalty": 9}, "presence_penalty"),
])
def test_infill_refusals(qwen: Server, body: dict[str, Any], param: str) -> None:
    before = qwen.scheduler.metrics.requests
    r = httpx.post(qwen.url + "/infill", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert qwen.scheduler.metrics.requests == before


def test_a_model_without_fim_tokens(model_path: Any) -> None:
    eng = Engine(model_path("smollm2"), n_ctx=256, threads=1, backend="cpu")
    srv = Server(eng, "smol", port=0)
    srv.start()
    try:
        r = httpx.post(srv.url + "/infill", json={"input_prefix": "a", "input_suffix": "b"}, timeout=60)
        assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):
            c.completions.create(model="smol", prompt="def f(", suffix="\n", max_tokens=4)
        assert srv.scheduler.metrics.requests == 0
    finally:
        srv.stop()
        eng.close()
