"""Token records and branches of chat replies (issue 20, chat part, core): records built from the engine's deltas
and stored compactly, versions of a reply (regenerate, branch at a token) kept with what followed them, stored in
SQLite (a schema-3 database migrates and keeps its messages), exported to JSON and Markdown; a branch continues
exactly as a fresh session fed the same tokens (greedy, on SmolLM2)."""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest

from quantscope.core.chat import SamplerParams, TokenChoice
from quantscope.core.chat.controller import ChatController
from quantscope.core.chat.store import (
    SCHEMA_VERSION,
    ChatStore,
    StoredMessage,
    add_variant,
    switch_variant,
    to_dict,
    to_markdown,
)
from quantscope.core.chat.tokens import (
    Alternative,
    ReplyTrace,
    TokenRecord,
    answer_spans,
    answer_text,
    branch_records,
    dumps,
    loads,
    piece_text,
    replay_tokens,
)
from quantscope.core.engine.generate import Engine


def rec(token: int, text: str, prob: float = 0.5, alts: tuple[int, ...] = (7, 8)) -> TokenRecord:
    return TokenRecord(token, text, text, prob, prob * 0.9, 1.25,
                       tuple(Alternative(a, f"<{a}>", 0.2 + 0.01 * k, 0.3) for k, a in enumerate(alts)))


def test_records_round_trip_compactly_and_bad_ones_are_refused() -> None:
    rs = [rec(1, "Hel"), rec(2, "lo ✓"), TokenRecord(3, "", "<|x|>", float("nan"), float("nan"), float("nan"),
                                                   channel="analysis", chosen=True)]
    text = dumps(rs)
    back = loads(text)
    assert [(r.token, r.text, r.piece, r.channel, r.chosen) for r in back] == [
        (r.token, r.text, r.piece, r.channel, r.chosen) for r in rs]
    assert back[0].prob == 0.5 and back[0].alternatives[1] == Alternative(8, "<8>", 0.21, 0.3)
    assert math.isnan(back[2].prob) and not back[2].known and back[0].known
    assert dumps([]) == "" and loads("") == []
    assert len(text) < 200  # compact: lists, no keys
    for bad in ("{", "{}", "[[1]]", '[[1,"a","a",2,0,0,[],"",0]]', '[[1,"a","a",0.1,0.1,0.1,[[1]],"",0]]',
                '[[true,"a","a",0.1,0.1,0.1,[],"",0]]', '[[1,"a","a",0.1,0.1,0.1,[],"",2]]',
                '[[1,5,"a",0.1,0.1,0.1,[],"",0]]', "[" * 5000):
        with pytest.raises(ValueError):
            loads(bad)


def test_trace_maps_deltas_to_tokens_and_text() -> None:
    t = ReplyTrace(lambda i: f"p{i}")
    c = TokenChoice(5, 0.25, 0.5, 2.0, ((9, 0.5, 0.4), (5, 0.25, 0.5)))
    t.add(4, "", "analysis", None)  # thinking: not part of the answer
    t.add(5, "", "", c)  # first bytes of a character: no text yet
    t.add(6, "é!", "", c)  # completes it
    t.add(None, "\ufffd", "")  # bytes held back at the end join the last answer token
    assert answer_text(t.records) == "é!\ufffd"
    assert answer_spans(t.records) == [(0, 3, 2)]
    assert t.records[1].alternatives[0] == Alternative(9, "p9", 0.5, 0.4) and t.records[1].piece == "p5"
    assert piece_text("é".encode()[:1]) == "<0xC3>" and piece_text(b"ab") == "ab"
    # a branch: the forced tokens keep their figures from the seed, the chosen one is marked
    seed = branch_records(t.records, 2, 9)
    assert [r.token for r in seed] == [4, 5, 9] and seed[-1].chosen and seed[-1].prob == 0.5
    assert seed[-1].entropy == 2.0 and replay_tokens(t.records, 2, 9) == [4, 5, 9]
    b = ReplyTrace(lambda i: f"p{i}", seed)
    for tok, text in ((4, ""), (5, ""), (9, "x")):
        b.add(tok, text, "", None, forced=True)
    b.add(11, "y", "", c)
    assert [r.chosen for r in b.records] == [False, False, True, False] and b.records[1].prob == 0.25
    assert answer_text(b.records) == "xy" and b.records[3].prob == 0.25
    with pytest.raises(ValueError):
        replay_tokens(t.records, 9, 1)
    with pytest.raises(ValueError):
        replay_tokens([TokenRecord(-1, "a", "", 0, 0, 0), rec(1, "b")], 1, 3)  # an unknown token before


def _conv() -> list[StoredMessage]:
    return [StoredMessage("user", "q1"), StoredMessage("assistant", "a1", tokens=[rec(1, "a"), rec(2, "1")]),
            StoredMessage("user", "q2"), StoredMessage("assistant", "a2")]


def test_versions_keep_what_followed_them() -> None:
    msgs = _conv()
    two = add_variant(msgs, 1, StoredMessage("assistant", "b1"))
    assert [m.content for m in two] == ["q1", "b1"] and two[1].variant == 1 and two[1].n_variants == 2
    assert [m.content for m in two[1].variants[0].after] == ["q2", "a2"]
    one = switch_variant(two, 1, 0)
    assert [m.content for m in one] == ["q1", "a1", "q2", "a2"] and one[1].variant == 0
    assert one[1].tokens[0].text == "a" and [v.message.content for v in one[1].variants] == ["b1"]
    again = switch_variant(one, 1, 1)
    assert [m.content for m in again] == ["q1", "b1"] and switch_variant(again, 1, 1) == again
    with pytest.raises(IndexError):
        switch_variant(again, 1, 2)
    with pytest.raises(IndexError):
        add_variant(again, 5, StoredMessage("assistant", "x"))


def test_controller_branches_regenerates_and_switches() -> None:
    ctl = ChatController()
    ctl.messages = _conv()
    forced, seed = ctl.begin_branch(1, 1, 8)
    assert forced == [1, 8] and seed[-1].chosen and [m.content for m in ctl.messages] == ["q1"]
    ctl.add_reply("a8", {"n_generated": 2}, tokens=[*seed, rec(3, "z")])
    assert [m.content for m in ctl.messages] == ["q1", "a8"] and ctl.messages[1].n_variants == 2
    assert ctl.messages[1].tokens[1].chosen
    ctl.switch_variant(1, 0)
    assert [m.content for m in ctl.messages] == ["q1", "a1", "q2", "a2"]
    # a regenerate of the last reply adds a version of it too
    assert ctl.drop_replies()
    ctl.add_reply("a2'", {})
    assert [m.content for m in ctl.messages] == ["q1", "a1", "q2", "a2'"] and ctl.messages[3].n_variants == 2
    # a branch that made nothing goes back
    before = [m.content for m in ctl.messages]
    ctl.begin_branch(1, 0, 7)
    ctl.abandon_variant()
    assert [m.content for m in ctl.messages] == before and ctl.pending_variant is None
    with pytest.raises(ValueError):
        ctl.begin_branch(0, 0, 1)  # a user message


OLD_SCHEMA_3 = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '', model_path TEXT NOT NULL DEFAULT '', model_quant TEXT NOT NULL DEFAULT '',
    model_size INTEGER NOT NULL DEFAULT 0, system_prompt TEXT NOT NULL DEFAULT '', mode TEXT NOT NULL DEFAULT 'chat',
    params TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE, position INTEGER NOT NULL,
    role TEXT NOT NULL, content TEXT NOT NULL, stats TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL,
    thinking TEXT NOT NULL DEFAULT '');
CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
INSERT INTO conversations (title, model, created, updated) VALUES ('before branches', 'SmolLM2.gguf', 1, 1);
INSERT INTO messages (conversation_id, position, role, content, created) VALUES (1, 0, 'user', 'hi', 1);
INSERT INTO messages (conversation_id, position, role, content, stats, created, thinking)
    VALUES (1, 1, 'assistant', 'hello', '{"n_generated": 1}', 2, 'hm');
PRAGMA user_version = 3;
"""


def test_schema_3_database_migrates_and_stores_branches(tmp_path) -> None:
    p = tmp_path / "old.sqlite3"
    db = sqlite3.connect(p)
    db.executescript(OLD_SCHEMA_3)
    db.commit()
    db.close()
    ctl = ChatController()
    with ChatStore(p) as s:
        assert s._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        old = s.get(1)
        assert [(m.role, m.content, m.thinking, m.tokens, m.n_variants) for m in old.messages] == [
            ("user", "hi", "", [], 1), ("assistant", "hello", "hm", [], 1)]
        assert s.list_conversations()[0].n_messages == 2
        # branch it and save: the versions, tokens and the shown one come back
        ctl.open(s, 1)
        ctl.messages[1] = StoredMessage("assistant", "hello", {"n_generated": 1}, 2, "hm", [rec(1, "hel"),
                                                                                          rec(2, "lo")])
        ctl.messages.append(StoredMessage("user", "more"))
        _forced, seed = ctl.begin_branch(1, 1, 7)
        ctl.add_reply("hel<7>", {"n_generated": 2}, tokens=[*seed])
        ctl.save(s, {})
    with ChatStore(p) as s:
        got = s.get(1).messages
        assert [m.content for m in got] == ["hi", "hel<7>"] and got[1].variant == 1 and got[1].n_variants == 2
        assert got[1].tokens[1].chosen and got[1].tokens[1].token == 7 and got[1].tokens[0].prob == 0.5
        v = got[1].variants[0]
        assert v.message.content == "hello" and v.message.thinking == "hm" and [a.content for a in v.after] == ["more"]
        assert [r.text for r in v.message.tokens] == ["hel", "lo"]
        assert s.list_conversations()[0].n_messages == 2  # the shown path
        # a damaged row keeps its text
        s._db.execute("UPDATE messages SET tokens = '[[1', variants = '{\"x\": 1}' WHERE position = 1")
        s._db.commit()
        bad = s.get(1).messages[1]
        assert bad.content == "hel<7>" and bad.tokens == [] and bad.variants == [] and bad.variant == 0


def test_export_has_every_version_with_token_probabilities(tmp_path) -> None:
    with ChatStore(tmp_path / "c.sqlite3") as s:
        msgs = add_variant(_conv(), 1, StoredMessage("assistant", "b1", {"n_generated": 2},
                                                     tokens=[rec(1, "b"), rec(9, "1")]))
        cid = s.create("branched", messages=msgs)
        conv = s.get(cid)
    d = json.loads(json.dumps(to_dict(conv)))
    m = d["messages"][1]
    assert m["content"] == "b1" and m["variant"] == 1 and len(d["messages"]) == 2
    assert m["tokens"][0] == {"token": 1, "text": "b", "piece": "b", "prob": 0.5, "scaled_prob": 0.45,
                              "entropy": 1.25, "alternatives": [
                                  {"token": 7, "piece": "<7>", "prob": 0.2, "scaled_prob": 0.3},
                                  {"token": 8, "piece": "<8>", "prob": 0.21, "scaled_prob": 0.3}]}
    other = m["variants"][0]
    assert other["message"]["content"] == "a1" and other["message"]["tokens"][1]["text"] == "1"
    assert [a["content"] for a in other["after"]] == ["q2", "a2"]
    md = to_markdown(conv)
    assert "## Assistant (version 2 of 2)" in md and "Other versions (1)" in md
    assert "**Version 1 of 2**, followed by 2 messages" in md
    assert md.index("b1") < md.index("a1")


@pytest.fixture(scope="module")
def smol(model_path):
    eng = Engine(model_path("smollm2"), n_ctx=512, threads=2)
    yield eng
    eng.close()


def _greedy_fresh(eng: Engine, ids: list[int], n: int) -> list[int]:
    """Greedy continuation of ``ids`` on a fresh session (the oracle: nothing cached, everything in one batch)."""
    s = eng.new_session(512)
    logits = np.asarray(s.forward(ids, logits=True))
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        if t in eng.eog:
            break
        out.append(t)
        logits = np.asarray(s.forward([t]))
    return out


def test_a_branch_continues_as_a_fresh_session_fed_the_same_tokens(smol) -> None:
    eng = smol
    msgs = [{"role": "user", "content": "Name three colours."}]
    greedy = SamplerParams(temperature=0, max_tokens=16, alternatives=10)
    piece = lambda t: piece_text(eng.tokenizer.token_bytes(t, True))  # noqa: E731
    first = ReplyTrace(piece)
    deltas = list(eng.generate(msgs, greedy))
    for d in deltas:
        first.add(d.token, d.text, d.channel, d.choice, d.forced)
    assert answer_text(first.records) == "".join(d.text for d in deltas)
    assert all(len(r.alternatives) == 10 and r.alternatives[0].token == r.token for r in first.records[:-1]
               if r.token >= 0)
    at = 3
    alt = first.records[at].alternatives[1].token
    forced, seed = replay_tokens(first.records, at, alt), branch_records(first.records, at, alt)
    branch = ReplyTrace(piece, seed)
    out = list(eng.generate(msgs, greedy, forced=forced))
    for d in out:
        branch.add(d.token, d.text, d.channel, d.choice, d.forced)
    assert [d.forced for d in out if d.token is not None][: at + 2] == [True] * (at + 1) + [False]
    assert out[-1].n_prompt_new == 1  # only the chosen token was evaluated: the rest came from the cache
    assert out[-1].n_prompt == len(eng.prompt_ids(msgs))
    made = [d.token for d in out if d.token is not None and not d.forced]
    want = _greedy_fresh(eng, eng.prompt_ids(msgs) + forced, len(made))
    assert made == want[: len(made)] and (len(made) == 16 or len(want) == len(made))
    text = answer_text(branch.records)
    assert text == eng.tokenizer.decode(forced + made, special=False)
    assert text.startswith(answer_text(first.records[:at])) and branch.records[at].chosen
    assert branch.records[at].prob == first.records[at].alternatives[1].prob
    with pytest.raises(ValueError, match="vocabulary"):
        list(eng.generate(msgs, greedy, forced=[eng.tokenizer.n_vocab]))
    # a forced end-of-generation token ends the reply there
    eos = next(iter(eng.eog))
    end = list(eng.generate(msgs, greedy, forced=[forced[0], eos]))
    assert end[-1].finished and end[-1].stop_reason == "end of generation" and end[-1].n_generated == 2


@pytest.mark.parametrize("arch", ["qwen35", "gemma3"])
def test_a_branch_of_a_recurrent_or_windowed_model_matches_a_fresh_session(arch, tmp_path) -> None:
    """qwen35's delta-net state cannot rewind position by position (the engine returns to its checkpoint or starts
    over); gemma3's sliding window: a branch still continues exactly as a fresh session fed the same tokens."""
    from .arch_fixtures import vocabulary, write_fixture

    eng = Engine(write_fixture(arch, tmp_path / f"{arch}.gguf", vocab=vocabulary()), n_ctx=256, backend="cpu")
    prompt = "the cat sat on the mat while the dog"
    greedy = SamplerParams(temperature=0, max_tokens=12, alternatives=5)
    first = [d for d in eng.generate(prompt, greedy) if d.token is not None]
    assert len(first) >= 4
    at = 2
    alt = next(a[0] for a in first[at].choice.alternatives if a[0] != first[at].token)
    forced = [d.token for d in first[:at]] + [alt]
    out = [d for d in eng.generate(prompt, greedy, forced=forced) if d.token is not None]
    assert [d.token for d in out[: at + 1]] == forced and all(d.forced for d in out[: at + 1])
    made = [d.token for d in out[at + 1 :]]
    want = _greedy_fresh(eng, eng.prompt_ids(prompt) + forced, len(made))
    assert made == want[: len(made)] and made
