"""Per-byte cost of constrained sampling (core/server/jsonmode.py, core/server/grammar.py) on a long JSON reply:
the automaton (json_object, a subset schema) and the grammar (the same schema compiled to GBNF, a rich schema,
llama.cpp's json.gbnf), fed byte by byte as the scheduler does, plus the 256-byte mask the scheduler builds when
the sampler's picks are refused. Figures only (no assertions).

Usage: PYTHONPATH=<clone>/.pypath python tests/bench/bench_structured.py [--reps 5]
(run it against two checkouts for a before/after: a schema the older one cannot compile is skipped)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from quantscope.core.server import jsonmode

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}},
                                           "friends": {"type": "array", "items": {"type": "object"}}},
          "required": ["name", "age"], "additionalProperties": False}
RICH = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 64},
                                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                         "tags": {"type": "array", "maxItems": 50,
                                                  "items": {"type": "string", "pattern": "^[a-z0-9 ]+$"}},
                                         "friends": {"type": "array", "items": {"anyOf": [{"type": "object"},
                                                                                          {"type": "null"}]}}},
        "required": ["name", "age"], "additionalProperties": False}


def reply() -> bytes:
    doc = {"name": "Ada Lovelace", "age": 36,
           "tags": [f"tag number {i} of the list" for i in range(40)],
           "friends": [{"name": f"friend {i}", "since": 1830 + i, "close": i % 2 == 0} for i in range(20)]}
    return json.dumps(doc, indent=2).encode()


def per_byte(schema: Any, text: bytes, reps: int) -> tuple[float, float]:
    """(µs per byte fed, µs per 256-byte mask): the least over ``reps`` (the noise of a shared machine only adds)."""
    feeds, masks = [], []
    for _ in range(reps):
        if schema[0] == "grammar":  # each repetition from scratch: nothing remembered from the one before
            schema[1].memo.clear()
        st = jsonmode.initial(schema)
        t0 = time.perf_counter()
        states = []
        for i in range(0, len(text), 4):  # token-sized pieces, as the scheduler feeds them
            st = jsonmode.feed(st, text[i:i + 4])
            assert st is not None
            states.append(st)
        feeds.append((time.perf_counter() - t0) / len(text) * 1e6)
        sample = states[:: max(1, len(states) // 50)]
        t0 = time.perf_counter()
        for s in sample:
            [jsonmode.step(s, c) is not None for c in range(256)]
        masks.append((time.perf_counter() - t0) / len(sample) * 1e6)
    return min(feeds), min(masks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    text = reply()
    cases: list[tuple[str, Any]] = [("json_object (automaton)", jsonmode.ANY_OBJECT),
                                    ("subset schema (automaton)", PERSON)]
    try:
        from quantscope.core.server.grammar import parse_grammar
        from quantscope.core.server.schema_grammar import schema_grammar
    except ImportError:
        pass
    else:
        cases += [("subset schema as a grammar", ("grammar", schema_grammar(PERSON))), ("rich schema (grammar)", RICH)]
        gbnf = Path.home() / ".cache/quantscope/llama.cpp-0.3.36/src/grammars/json.gbnf"
        if gbnf.is_file():
            cases.append(("llama.cpp json.gbnf (grammar)", ("grammar", parse_grammar(gbnf.read_text()))))
    print(f"reply: {len(text)} bytes; best of {args.reps}")
    print(f"{'schema':34s} {'µs/byte':>9s} {'µs/mask':>9s}")
    for name, schema in cases:
        if isinstance(schema, dict):
            try:
                schema = jsonmode.compile_schema(schema)
            except jsonmode.SchemaError as exc:
                print(f"{name:34s} {'-':>9s} {'-':>9s}  ({exc})")
                continue
        f, m = per_byte(schema, text, args.reps)
        print(f"{name:34s} {f:9.2f} {m:9.1f}")
        if schema[0] == "grammar":  # the same with (almost) nothing remembered: a reply that never repeats a state
            from quantscope.core.server import grammar

            keep, grammar.MEMO = grammar.MEMO, 1
            f, m = per_byte(schema, text, max(1, args.reps // 3))
            grammar.MEMO = keep
            print(f"{'  (nothing remembered)':34s} {f:9.2f} {m:9.1f}")


if __name__ == "__main__":
    main()
