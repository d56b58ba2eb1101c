"""The one session protocol (core/engine/session.py's InferenceSession): both backends' sessions have every member
with the protocol's signature (checked on the host, no GPU), and every caller (the probe, the importance matrix,
perplexity and KL divergence, the chat's engine) uses nothing else: each runs against a session that has the
protocol's members only, delegating to a CPU session, and gives what it gives on the CPU session itself."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.chat import SamplerParams
from quantscope.core.engine import generate as G
from quantscope.core.engine import imatrix as IM
from quantscope.core.engine import kld, tools
from quantscope.core.engine import probe as P
from quantscope.core.engine.cuda_backend import CudaSession
from quantscope.core.engine.session import InferenceSession, Model, Session
from quantscope.core.engine.split import SplitSession
from quantscope.core.tokenizer import Tokenizer

from .arch_fixtures import vocabulary, write_fixture

TEXT = (Path(__file__).parent / "data" / "english.txt").read_text(encoding="utf-8")[:3000]
DATA = ("n_ctx", "n_past")


def protocol_members() -> list[str]:
    return sorted(n for n in vars(InferenceSession) if not n.startswith("_") and n not in DATA) + list(DATA)


def _sig(f: object) -> inspect.Signature:
    return inspect.signature(f)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [Session, CudaSession, SplitSession])
def test_both_sessions_have_every_protocol_member_with_its_signature(cls):
    members = protocol_members()
    assert {"forward", "head", "attention_weights", "set_activation_stats", "truncate", "reset", "checkpoint",
            "close", "kv_bytes"} <= set(members)
    for name in members:
        if name in DATA:  # instance attributes: set by the constructor
            assert f"self.{name} =" in inspect.getsource(cls.__init__), name
            continue
        want = vars(InferenceSession)[name]
        got = getattr(cls, name, None)
        assert got is not None, f"{cls.__name__} has no {name}"
        if isinstance(want, property):
            assert isinstance(got, property), name
            assert _sig(got.fget).return_annotation == _sig(want.fget).return_annotation, name
            continue
        assert callable(got), name
        assert _sig(got) == _sig(want), f"{cls.__name__}.{name}{_sig(got)} != protocol {_sig(want)}"


class NotInProtocol(Exception):
    """A caller used a session member the protocol does not have (not an AttributeError: hasattr would hide it)."""


class ProtocolOnly:
    """A session with the protocol's members and nothing else, each delegated to a real session and recorded."""

    def __init__(self, inner: Session) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "used", set())

    def __getattribute__(self, name: str) -> object:
        if name in ("_inner", "used") or (name.startswith("__") and name.endswith("__")):
            return object.__getattribute__(self, name)
        if name not in protocol_members():
            raise NotInProtocol(name)
        object.__getattribute__(self, "used").add(name)
        return getattr(object.__getattribute__(self, "_inner"), name)

    def __setattr__(self, name: str, value: object) -> None:
        raise NotInProtocol(f"set {name}")


def test_the_recording_session_refuses_other_members():
    s = ProtocolOnly(None)  # type: ignore[arg-type]
    with pytest.raises(NotInProtocol):
        s.forward_from  # noqa: B018
    with pytest.raises(NotInProtocol):
        hasattr(s, "model")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_fixture("llama", tmp_path_factory.mktemp("protocol") / "llama.gguf", vocab=vocabulary())


IDS = [int(t) for t in np.random.default_rng(4).integers(0, 1024, 12)]


def test_probe_uses_only_the_protocol(llama):
    m = Model.load(str(llama), threads=2)
    made: list[ProtocolOnly] = []

    def make(n: int, dtype: type) -> InferenceSession:
        made.append(ProtocolOnly(m.session(n, dtype)))
        return made[-1]  # type: ignore[return-value]

    pr = P.run_probe(m, IDS, make_session=make)
    ref = P.run_probe(m, IDS)
    lens, ref_lens = P.logit_lens(pr, top=5), P.logit_lens(ref, top=5)
    assert np.array_equal(lens.top_ids, ref_lens.top_ids) and np.array_equal(lens.top_probs, ref_lens.top_probs)
    assert np.array_equal(pr.attention(1), ref.attention(1), equal_nan=True)
    assert np.array_equal(P.activations(pr).rms, P.activations(ref).rms)
    assert {"forward", "head", "attention_weights"} <= made[0].used


def test_perplexity_and_kl_divergence_use_only_the_protocol(llama, tmp_path):
    m = Model.load(str(llama), threads=2)
    tok = Tokenizer(m.file)
    made: list[ProtocolOnly] = []

    def make(n: int) -> InferenceSession:
        made.append(ProtocolOnly(m.session(n)))
        return made[-1]  # type: ignore[return-value]

    ppl = tools.perplexity(m, tok, TEXT, 64, max_chunks=2, make_session=make)
    assert ppl.ppl == tools.perplexity(m, tok, TEXT, 64, max_chunks=2).ppl
    n, _ = kld.write_base(tmp_path / "base.kld", m, tok, TEXT, 64, max_chunks=2, make_session=make)
    res = kld.kl_divergence(kld.KLDBase(tmp_path / "base.kld"), m, tok, make_session=make)
    assert n == 2 and res.n_chunks == 2
    assert all({"reset", "forward"} <= s.used for s in made) and len(made) == 3


def test_imatrix_uses_only_the_protocol(llama, monkeypatch):
    ref = IM.compute_imatrix(llama, TEXT, n_ctx=64, max_chunks=2, threads=2)
    made: list[ProtocolOnly] = []

    class Wrapped(G.Engine):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(ProtocolOnly(self.session))  # type: ignore[arg-type]
            self.session = made[-1]  # type: ignore[assignment]

    monkeypatch.setattr(G, "Engine", Wrapped)
    got = IM.compute_imatrix(llama, TEXT, n_ctx=64, max_chunks=2, threads=2)
    assert made and {"set_activation_stats", "reset", "forward"} <= made[0].used
    assert got.entries.keys() == ref.entries.keys() and got.entries
    for name, e in ref.entries.items():
        assert np.array_equal(got.entries[name].sums, e.sums), name


def test_chat_engine_uses_only_the_protocol_and_its_alternatives_come_from_the_logits(llama):
    """The chat's engine (generate, a regenerated reply, a branch, close) through the protocol alone; the token
    alternatives it records are the same as on the session itself (they come from the logits forward returns)."""
    params = SamplerParams(temperature=0.0, max_tokens=6, alternatives=5)
    runs = []
    for wrap in (False, True):
        eng = G.Engine(llama, n_ctx=128, threads=2, backend="cpu", repack=False)
        if wrap:
            eng.session = ProtocolOnly(eng.session)  # type: ignore[assignment]
        try:
            out = [d for d in eng.generate("Hello there", params)]
            out += [d for d in eng.generate("Hello there", params)]  # the same prompt: the cache is rewound
            out += [d for d in eng.generate("Hello there", params, forced=[out[0].token or 5])]
            runs.append([(d.token, d.choice) for d in out])
            if wrap:
                assert {"forward", "truncate", "n_past", "checkpoint"} <= eng.session.used  # type: ignore[union-attr]
        finally:
            eng.close()
    assert runs[0] == runs[1]
    assert any(c is not None and len(c.alternatives) == 5 for _, c in runs[0])
