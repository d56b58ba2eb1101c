"""Choices and penalties on the server: ``n`` > 1 (each choice its own job, OpenAI's ``index`` on every choice and
chunk, usage over all of them), presence and frequency penalties (llama.cpp's ``llama_sampler_penalties``
formula: checked against a numpy reference, against llama.cpp's own sampler where its build is on this machine,
and through the server by a greedy reference loop on the engine), Ollama's penalty options, ``echo``, and the
refusals of hostile values before the engine. Real ``openai`` and ``ollama`` clients against a real server on
127.0.0.1 (SmolLM2, the CPU engine)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest

from quantscope.core.chat import SamplerParams, apply_penalties
from quantscope.core.engine.generate import Engine
from quantscope.core.server import Server

REPEATS = "red blue green red blue green red blue green red blue green red blue green red blue"


def reference(logits: np.ndarray, history: list[int], prompt_len: int, last_n: int, repeat: float, freq: float,
              present: float) -> np.ndarray:
    """The penalties as llama.cpp's llama_sampler_penalties_apply writes them, token by token in float32: the
    window is the last ``last_n`` tokens; counts are of the generated tokens in it (after ``prompt_len``)."""
    out = np.asarray(logits, dtype=np.float32).copy()
    window = history[-last_n:] if last_n > 0 else []
    first_generated = min(prompt_len, len(history))  # the reply's first token in the history
    counts: dict[int, int] = {}
    for pos in range(len(history) - len(window), len(history)):
        t = history[pos]
        counts.setdefault(t, 0)
        if pos >= first_generated:
            counts[t] += 1
    for t, c in counts.items():
        v = out[t]
        v = v * np.float32(repeat) if v <= 0 else v / np.float32(repeat)
        v = np.float32(v) - (np.float32(c) * np.float32(freq) + np.float32(c > 0) * np.float32(present))
        out[t] = v
    return out


def penalized(logits: np.ndarray, history: list[int], prompt_len: int, **kw: Any) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64).copy()
    apply_penalties(x, history, prompt_len, SamplerParams(**kw))
    return x


CASES = [  # (last_n, repeat, frequency, presence, prompt_len)
    (64, 1.0, 0.5, 0.0, 0), (64, 1.0, 0.0, 1.5, 0), (64, 1.3, 0.7, 0.4, 0), (8, 1.1, -0.5, -1.0, 0),
    (64, 1.2, 1.0, 0.5, 20), (5, 1.0, 2.0, 2.0, 0), (0, 1.5, 2.0, 2.0, 0), (64, 1.0, -2.0, 0.0, 30)]


@pytest.mark.parametrize(("last_n", "repeat", "freq", "present", "prompt_len"), CASES)
def test_penalties_match_the_reference(last_n: int, repeat: float, freq: float, present: float,
                                       prompt_len: int) -> None:
    rng = np.random.default_rng(last_n + prompt_len)
    logits = rng.normal(0, 4, 50).astype(np.float32)
    history = [int(t) for t in rng.integers(0, 12, 40)]  # (tokens 0..11 repeat often, many logits <= 0)
    got = penalized(logits, history, prompt_len, repeat_last_n=last_n, repeat_penalty=repeat,
                    frequency_penalty=freq, presence_penalty=present)
    want = reference(logits, history, prompt_len, last_n, repeat, freq, present)
    assert np.array_equal(got.astype(np.float32), want)
    if last_n == 0:
        assert np.array_equal(want, logits)  # llama.cpp's "0: off"
    else:
        assert not np.array_equal(want, logits)


def _llama_penalties_tool(tmp: Path) -> Path | None:
    """A 15-line program on llama.cpp's own llama_sampler_init_penalties, linked against the build of
    tests/bench/llamacpp_build.py when it is on this machine (None otherwise)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent / "bench"))
    import llamacpp_build

    root = llamacpp_build.cache_root()
    libs = [root / "build" / p for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                         "ggml/src/libggml-base.a")]
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None or not all(p.exists() for p in libs) or not (root / "src" / "include" / "llama.h").exists():
        return None
    src = tmp / "pen.cpp"
    src.write_text("""#include "llama.h"
#include <cstdio>
#include <vector>
int main() {
    int n_vocab, last_n, n_hist; float rep, freq, pres;
    if (scanf("%d %d %f %f %f %d", &n_vocab, &last_n, &rep, &freq, &pres, &n_hist) != 6) return 2;
    llama_sampler * s = llama_sampler_init_penalties(n_vocab, last_n, rep, freq, pres);
    for (int i = 0; i < n_hist; i++) { int t; if (scanf("%d", &t) != 1) return 2; llama_sampler_accept(s, t); }
    std::vector<llama_token_data> d(n_vocab);
    for (int i = 0; i < n_vocab; i++) { float v; if (scanf("%a", &v) != 1) return 2; d[i] = {i, v, 0.0f}; }
    llama_token_data_array a = {d.data(), (size_t) n_vocab, -1, false};
    llama_sampler_apply(s, &a);
    for (size_t i = 0; i < a.size; i++) printf("%d %a\\n", a.data[i].id, a.data[i].logit);
    llama_sampler_free(s);
}
""")
    exe = tmp / "pen"
    subprocess.run([cxx, "-O1", "-std=c++17", f"-I{root / 'src' / 'include'}", f"-I{root / 'src' / 'ggml' / 'include'}",
                    str(src), *map(str, libs), "-lpthread", "-fopenmp", "-ldl", "-o", str(exe)], check=True,
                   capture_output=True)
    return exe


def test_penalties_match_llama_cpps_sampler(tmp_path: Path) -> None:
    exe = _llama_penalties_tool(tmp_path)
    if exe is None:
        pytest.skip("llama.cpp's build (tests/bench/llamacpp_build.py) or a C++ compiler is not on this machine")
    for last_n, repeat, freq, present, _p in CASES:
        rng = np.random.default_rng(7 + last_n)
        logits = rng.normal(0, 4, 300).astype(np.float32)
        history = [int(t) for t in rng.integers(0, 40, 90)]
        # llama.cpp's sampler counts every token it accepted: here the whole history is the reply (prompt_len 0)
        stdin = f"{logits.size} {last_n} {repeat!r} {freq!r} {present!r} {len(history)} {' '.join(map(str, history))}\n"
        stdin += " ".join(float(v).hex() for v in logits) + "\n"
        out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.split()
        theirs = np.zeros(logits.size, np.float32)
        for tid, v in zip(out[0::2], out[1::2], strict=True):
            theirs[int(tid)] = float.fromhex(v)
        ours = penalized(logits, history, 0, repeat_last_n=last_n, repeat_penalty=repeat, frequency_penalty=freq,
                         presence_penalty=present).astype(np.float32)
        assert np.array_equal(ours, theirs)  # the same float32 operations: bit for bit


# ---------------------------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def server(model_path: Any) -> Iterator[Server]:
    eng = Engine(model_path("smollm2"), n_ctx=512, threads=1, backend="cpu")
    srv = Server(eng, "m", port=0, parallel=2)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        eng.close()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


ASK = [{"role": "user", "content": "Name a colour."}]


def test_n_choices_greedy_are_identical(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="m", messages=ASK, n=3, temperature=0, max_tokens=12)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = {c.message.content for c in r.choices}
    assert len(texts) == 1 and texts != {""}
    one = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=12)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    c = client.completions.create(model="m", prompt="The sky is", n=2, temperature=0, max_tokens=8)
    assert [x.index for x in c.choices] == [0, 1] and c.choices[0].text == c.choices[1].text


def test_n_choices_read_the_prompt_once(server: Server, client: openai.OpenAI, model_path: Any) -> None:
    m = server.scheduler.metrics
    before = m.prompt_tokens, m.cached_tokens
    prompt = "A prompt read once for three choices: the slots copy its cache."
    r = client.completions.create(model="m", prompt=prompt, n=3, temperature=0, max_tokens=8)
    n = r.usage.prompt_tokens
    assert m.prompt_tokens - before[0] == n and m.cached_tokens - before[1] == 2 * n
    # the copied caches give what the prompt gives read alone, on an engine of its own
    assert {c.text for c in r.choices} == {greedy_reference(model_path("smollm2"), prompt, 8)}


def test_n_choices_sampled_differ(client: openai.OpenAI) -> None:
    r = client.completions.create(model="m", prompt="Once upon a time", n=3, temperature=1.5, top_p=1, seed=11,
                                  max_tokens=24, extra_body={"ignore_eos": True, "top_k": 0, "min_p": 0})
    texts = [c.text for c in r.choices]
    assert len(set(texts)) > 1, texts  # choice i samples with seed + i
    assert r.usage.completion_tokens == 3 * 24 and all(c.finish_reason == "length" for c in r.choices)


@pytest.mark.parametrize("chat", [True, False])
def test_n_choices_streamed(client: openai.OpenAI, chat: bool) -> None:
    kw: dict[str, Any] = dict(model="m", n=3, temperature=0, max_tokens=6, stream=True,
                              stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    parts: dict[int, list[str]] = {0: [], 1: [], 2: []}
    reasons: dict[int, str] = {}
    usage = None
    if chat:
        stream: Any = client.chat.completions.create(messages=ASK, **kw)
    else:
        stream = client.completions.create(prompt="The sky is", **kw)
    for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            parts[c.index].append((c.delta.content or "") if chat else c.text)
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert reasons == {0: "length", 1: "length", 2: "length"}
    texts = {"".join(p) for p in parts.values()}
    assert len(texts) == 1 and texts != {""}
    assert usage is not None and usage.completion_tokens == 18


def greedy_reference(path: Path, prompt: str, steps: int, **penalties: float) -> str:
    """A greedy loop on the engine itself, with the numpy reference of the penalties between forward passes."""
    eng = Engine(path, n_ctx=512, threads=1, backend="cpu")
    try:
        tok = eng.tokenizer
        ids = tok.encode(prompt)
        s = eng.new_session(512)
        logits = s.forward(ids)
        history, out = list(ids), []
        for _ in range(steps):
            x = reference(logits, history, len(ids), 64, penalties.get("repeat", 1.0), penalties.get("freq", 0.0),
                          penalties.get("present", 0.0))
            t = int(np.argmax(x))
            if t in eng.eog:
                break
            out.append(t)
            history.append(t)
            logits = s.forward([t])
        return b"".join(tok.token_bytes(t, False) for t in out).decode("utf-8", "replace")
    finally:
        eng.close()


def test_penalties_change_the_greedy_reply_as_the_formula_says(client: openai.OpenAI, model_path: Any) -> None:
    path = model_path("smollm2")

    def ask(**kw: Any) -> str:
        return client.completions.create(model="m", prompt=REPEATS, temperature=0, max_tokens=16, **kw).choices[0].text

    plain = ask()
    assert plain.split().count("blue") >= 3  # the prompt's words go on repeating
    for kw, ref in (({"frequency_penalty": 1.5}, {"freq": 1.5}), ({"presence_penalty": 2.0}, {"present": 2.0}),
                    ({"frequency_penalty": 0.8, "presence_penalty": 0.5, "extra_body": {"repeat_penalty": 1.2}},
                     {"freq": 0.8, "present": 0.5, "repeat": 1.2})):
        got = ask(**kw)
        assert got == greedy_reference(path, REPEATS, 16, **ref)
        assert got != plain
    assert plain == greedy_reference(path, REPEATS, 16)


def test_ollama_penalty_options(server: Server) -> None:
    o = ollama.Client(host=server.url, timeout=120)
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    opts = {"temperature": 0, "num_predict": 16, "frequency_penalty": 1.5, "presence_penalty": 0.5,
            "repeat_penalty": 1.1}
    r = o.generate(model="m", prompt=REPEATS, raw=True, options=opts)
    want = oa.completions.create(model="m", prompt=REPEATS, temperature=0, max_tokens=16, frequency_penalty=1.5,
                                 presence_penalty=0.5, extra_body={"repeat_penalty": 1.1}).choices[0].text
    assert r.response == want
    plain = o.generate(model="m", prompt=REPEATS, raw=True, options={"temperature": 0, "num_predict": 16})
    assert plain.response != r.response
    with pytest.raises(ollama.ResponseError, match=r"options\.presence_penalty"):
        o.generate(model="m", prompt="x", options={"presence_penalty": 3.5})


def test_echo(client: openai.OpenAI) -> None:
    r = client.completions.create(model="m", prompt="The sky is", echo=True, temperature=0, max_tokens=6)
    plain = client.completions.create(model="m", prompt="The sky is", temperature=0, max_tokens=6)
    assert r.choices[0].text == "The sky is" + plain.choices[0].text
    stream = client.completions.create(model="m", prompt="The sky is", echo=True, temperature=0, max_tokens=6,
                                       stream=True, n=2)
    texts: dict[int, str] = {0: "", 1: ""}
    for ch in stream:
        for c in ch.choices:
            texts[c.index] += c.text
    assert texts == {0: r.choices[0].text, 1: r.choices[0].text}


@pytest.mark.parametrize("prompt", ["The capital of France is",  # one chunk; and several (64 tokens each):
                                    " ".join(f"item {i}," for i in range(40)) + " and the last item is"])
def test_echo_with_logprobs(client: openai.OpenAI, model_path: Any, prompt: str) -> None:
    r = client.completions.create(model="m", prompt=prompt, echo=True, logprobs=3, temperature=0, max_tokens=4)
    plain = client.completions.create(model="m", prompt=prompt, logprobs=3, temperature=0, max_tokens=4)
    c, k = r.choices[0], r.usage.prompt_tokens
    lp = c.logprobs
    assert c.text == prompt + plain.choices[0].text and "".join(lp.tokens[:k]) == prompt
    assert lp.tokens[k:] == plain.choices[0].logprobs.tokens
    assert lp.token_logprobs[k:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, rel=1e-9)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.tokens) == k + 4
    assert lp.text_offset == [len("".join(lp.tokens[:j])) for j in range(len(lp.tokens))]
    # each prompt token's logprob under the logits before it, from an engine of its own
    eng = Engine(model_path("smollm2"), n_ctx=512, threads=1, backend="cpu")
    try:
        ids = eng.tokenizer.encode(prompt)
        rows = np.asarray(eng.new_session(512).forward(ids, all_logits=True), dtype=np.float64)
    finally:
        eng.close()
    logz = rows.max(1) + np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1))
    want = [float(rows[j, ids[j + 1]] - logz[j]) for j in range(k - 1)]
    assert lp.token_logprobs[1:k] == pytest.approx(want, rel=1e-4, abs=1e-4)  # (read in other chunks here)
    assert all(len(t) == 3 and max(t.values()) >= lp.token_logprobs[j + 1] - 1e-9
               for j, t in enumerate(lp.top_logprobs[1:k]))
    stream = client.completions.create(model="m", prompt=prompt, echo=True, logprobs=3, temperature=0,
                                       max_tokens=4, stream=True)
    text, toks = "", []
    for ch in stream:
        for x in ch.choices:
            text += x.text
            toks += x.logprobs.tokens if x.logprobs else []
    assert text == c.text and toks == lp.tokens


@pytest.mark.parametrize(("body", "param"), [
    ({"n": 0}, "n"), ({"n": 1000}, "n"), ({"n": 2.5}, "n"), ({"n": True}, "n"),
    ({"presence_penalty": 3.5}, "presence_penalty"), ({"presence_penalty": -3.5}, "presence_penalty"),
    ({"frequency_penalty": 3.5}, "frequency_penalty"), ({"frequency_penalty": "high"}, "frequency_penalty"),
    ({"echo": True, "messages": ASK}, "echo"), ({"suffix": "x", "messages": ASK}, "suffix"),
    ({"suffix": 3}, "suffix"), ({"suffix": "x", "prompt": [1, 2]}, "suffix"),
    ({"suffix": "\n}\n"}, "suffix"),  # SmolLM2 has no FIM tokens
])
def test_hostile_values_refused_before_the_engine(server: Server, body: dict[str, Any], param: str) -> None:
    before = server.scheduler.metrics.requests
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    full = {"model": "m", "prompt": "def f(", "max_tokens": 2} | body
    r = httpx.post(server.url + path, json=full, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert server.scheduler.metrics.requests == before
    if param == "suffix" and body.get("suffix") == "\n}\n":
        assert "fill-in-the-middle" in r.json()["error"]["message"]


@pytest.mark.parametrize("raw", [b'{"prompt": "x", "presence_penalty": NaN}', b'{"prompt": "x", "n": Infinity}',
                                 b'{"prompt": "x", "frequency_penalty": 1e999}'])
def test_non_finite_numbers_refused(server: Server, raw: bytes) -> None:
    before = server.scheduler.metrics.requests
    r = httpx.post(server.url + "/v1/completions", content=raw, headers={"Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 400 and server.scheduler.metrics.requests == before
    json.loads(r.text)
