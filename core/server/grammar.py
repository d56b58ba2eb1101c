"""llama.cpp's GBNF grammars: :func:`parse_grammar` reads one (the ``grammar`` request field, or a JSON Schema
compiled by :mod:`.schema_grammar`) and :func:`step` holds the output to it byte by byte, as llama.cpp's
src/llama-grammar.cpp does: a state is a set of stacks of positions in the rules, advanced per code point.

Syntax as llama.cpp's parser takes it: ``name ::= alternatives`` (a rule ends at a newline outside parentheses),
``|``, sequences, ``"literals"`` and ``[classes]`` / ``[^classes]`` with ranges and the escapes ``\\x.. \\u....
\\U........ \\t \\r \\n \\\\ \\" \\[ \\] \\-``, ``.`` (any code point), ``( groups )``, ``* + ?`` and ``{m}``,
``{m,}``, ``{m,n}`` (rewritten into rules the same way), ``#`` comments; the start rule is ``root``. Token
references (``<[id]>``, ``<name>``) are refused: they name a model's tokens, not text.

Hostile grammars are refused before any sampling (:class:`GrammarError`, one line): over :data:`MAX_TEXT`
characters or :data:`MAX_ELEMENTS` elements after the repetitions are written out, groups nested deeper than
:data:`MAX_GROUPS`, an undefined rule, a left recursion (a rule that can reach itself without output while
something waits after it, which would expand forever), a point that expands to more than :data:`MAX_STACKS`
alternatives, or expansions larger than :data:`MAX_EXPANSION` in all (what each position can begin with is
computed once, here). While sampling each byte costs a bounded amount of work: a state keeps at most
:data:`MAX_STACKS` stacks of at most :data:`MAX_STACK` positions (an ambiguous grammar's further parses are
dropped: the output stays valid) and states are immutable tuples, so trying a candidate token never disturbs the
current one. Output is UTF-8: a code point's bytes are
checked as they come (a lead byte only where some character it can begin is allowed), overlong forms and
surrogates are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_TEXT = 1 << 17  # characters of grammar text
MAX_ELEMENTS = 1 << 17  # elements once repetitions are written out
MAX_GROUPS = 100  # parentheses nested in one another
MAX_REPEAT = 2000  # as llama.cpp: {m,n} with m above is refused, n above means no upper bound
MAX_EXPANSION = 1 << 17  # stack tails in all the rules' expansions
MAX_STACKS = 1024  # parses a state follows at once (and alternatives one position may expand to)
MAX_STACK = 1024  # positions in one stack (nesting of rules that have not ended)

CHAR, REF, END = 0, 1, 2
Ranges = tuple[tuple[int, int], ...]


class GrammarError(ValueError):
    """A grammar that cannot be used (its text says where)."""


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-" or c == "_")


class _Parser:
    """llama.cpp's recursive-descent parser over the grammar text (src/llama-grammar.cpp), building rules as
    lists of alternatives, each a list of ``(CHAR, (negated, ranges))`` or ``(REF, rule id)`` elements."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.ids: dict[str, int] = {}
        self.rules: dict[int, list[list[tuple[int, Any]]]] = {}
        self.elements = 0
        self.depth = 0

    def sym(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids))

    def new_sym(self, base: str) -> int:
        n = len(self.ids)
        self.ids[f"{base}_{n}"] = n
        return n

    def add(self, rid: int, alts: list[list[tuple[int, Any]]]) -> None:
        self.elements += sum(len(a) + 1 for a in alts)
        if self.elements > MAX_ELEMENTS:
            raise GrammarError(f"the grammar is larger than {MAX_ELEMENTS} elements once its repetitions are "
                               "written out")
        self.rules[rid] = alts

    def err(self, what: str, pos: int) -> GrammarError:
        near = self.s[pos:pos + 20].replace("\n", "\\n")
        return GrammarError(f"{what} at {near!r}" if near else f"{what} at the end")

    def space(self, pos: int, newline_ok: bool) -> int:
        s = self.s
        while pos < len(s) and (s[pos] in " \t#" or (newline_ok and s[pos] in "\r\n")):
            if s[pos] == "#":
                while pos < len(s) and s[pos] not in "\r\n":
                    pos += 1
            else:
                pos += 1
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while end < len(self.s) and _is_word(self.s[end]):
            end += 1
        if end == pos:
            raise self.err("expecting a name", pos)
        return end

    def char(self, pos: int) -> tuple[int, int]:
        s = self.s
        if pos >= len(s):
            raise self.err("unexpected end of input", pos)
        if s[pos] != "\\":
            return ord(s[pos]), pos + 1
        e = s[pos + 1:pos + 2]
        if e in ("x", "u", "U"):
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = s[pos + 2:pos + 2 + n]
            if len(digits) != n or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise self.err(f"expecting {n} hex digits", pos)
            v = int(digits, 16)
            if v > 0x10FFFF:
                raise self.err("not a Unicode code point", pos)
            return v, pos + 2 + n
        simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
        if e in simple:
            return simple[e], pos + 2
        raise self.err("unknown escape", pos)

    def parse(self) -> None:
        pos = self.space(0, True)
        while pos < len(self.s):
            end = self.name(pos)
            rid = self.sym(self.s[pos:end])
            pos = self.space(end, False)
            if not self.s.startswith("::=", pos):
                raise self.err("expecting ::=", pos)
            pos = self.alternates(self.space(pos + 3, True), self.s[pos:end], rid, False)
            if pos < len(self.s):
                if self.s[pos] == "\r":
                    pos += 2 if self.s[pos + 1:pos + 2] == "\n" else 1
                elif self.s[pos] == "\n":
                    pos += 1
                else:
                    raise self.err("expecting a newline or the end", pos)
            pos = self.space(pos, True)
        for name, rid in self.ids.items():
            if rid not in self.rules:
                raise GrammarError(f"the rule {name!r} is used but not defined")

    def alternates(self, pos: int, name: str, rid: int, nested: bool) -> int:
        self.depth += 1
        if self.depth > MAX_GROUPS:
            raise self.err(f"groups nested more than {MAX_GROUPS} deep", pos)
        try:
            return self._alternates(pos, name, rid, nested)
        finally:
            self.depth -= 1

    def _alternates(self, pos: int, name: str, rid: int, nested: bool) -> int:
        alts: list[list[tuple[int, Any]]] = []
        seq: list[tuple[int, Any]] = []
        pos = self.sequence(pos, name, seq, nested)
        alts.append(seq)
        while pos < len(self.s) and self.s[pos] == "|":
            seq = []
            pos = self.sequence(self.space(pos + 1, True), name, seq, nested)
            alts.append(seq)
        self.add(rid, alts)
        return pos

    def sequence(self, pos: int, name: str, seq: list[tuple[int, Any]], nested: bool) -> int:
        s = self.s
        last = len(seq)
        n_prev = 1
        while pos < len(s):
            c = s[pos]
            if c == '"':
                pos += 1
                last, n_prev = len(seq), 1
                while True:
                    if pos >= len(s):
                        raise self.err("unexpected end of input", pos)
                    if s[pos] == '"':
                        break
                    v, pos = self.char(pos)
                    seq.append((CHAR, (False, ((v, v),))))
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                neg = s[pos:pos + 1] == "^"
                pos += neg
                ranges: list[tuple[int, int]] = []
                while True:
                    if pos >= len(s):
                        raise self.err("unexpected end of input", pos)
                    if s[pos] == "]":
                        break
                    lo, pos = self.char(pos)
                    hi = lo
                    if s[pos:pos + 1] == "-" and s[pos + 1:pos + 2] != "]":
                        if pos + 1 >= len(s):
                            raise self.err("unexpected end of input", pos)
                        hi, pos = self.char(pos + 1)
                    ranges.append((lo, hi))
                last, n_prev = len(seq), 1
                seq.append((CHAR, (neg, tuple(ranges))))
                pos = self.space(pos + 1, nested)
            elif c in "<!":
                raise self.err("token references (<[id]>) are not supported: a grammar here describes text", pos)
            elif _is_word(c):
                end = self.name(pos)
                last, n_prev = len(seq), 1
                seq.append((REF, self.sym(s[pos:end])))
                pos = self.space(end, nested)
            elif c == "(":
                before = len(self.ids)
                sub = self.new_sym(name)
                pos = self.alternates(self.space(pos + 1, True), name, sub, True)
                n_prev = max(1, len(self.ids) - before)
                last = len(seq)
                seq.append((REF, sub))
                if pos >= len(s) or s[pos] != ")":
                    raise self.err("expecting ')'", pos)
                pos = self.space(pos + 1, nested)
            elif c == ".":
                last, n_prev = len(seq), 1
                seq.append((CHAR, (True, ())))
                pos = self.space(pos + 1, nested)
            elif c in "*+?":
                pos = self.space(pos + 1, nested)
                lo_n, hi_n = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                n_prev = self.repeat(seq, last, lo_n, hi_n, name, n_prev, pos)
            elif c == "{":
                pos = self.space(pos + 1, nested)
                lo_n, pos = self.integer(pos)
                pos = self.space(pos, nested)
                hi_n: int | None = lo_n
                if s[pos:pos + 1] == ",":
                    pos = self.space(pos + 1, nested)
                    hi_n = None
                    if s[pos:pos + 1].isdigit():
                        hi_n, pos = self.integer(pos)
                        pos = self.space(pos, nested)
                if s[pos:pos + 1] != "}":
                    raise self.err("expecting '}'", pos)
                pos = self.space(pos + 1, nested)
                if lo_n > MAX_REPEAT:
                    raise self.err(f"more than {MAX_REPEAT} repetitions", pos)
                if hi_n is not None and hi_n > MAX_REPEAT:
                    hi_n = None
                if hi_n is not None and hi_n < lo_n:
                    raise self.err("a repetition's maximum is below its minimum", pos)
                n_prev = self.repeat(seq, last, lo_n, hi_n, name, n_prev, pos)
            else:
                break
        return pos

    def integer(self, pos: int) -> tuple[int, int]:
        end = pos
        while end < len(self.s) and self.s[end].isascii() and self.s[end].isdigit():
            end += 1
        if end == pos or end - pos > 9:
            raise self.err("expecting an integer", pos)
        return int(self.s[pos:end]), end

    def repeat(self, seq: list[tuple[int, Any]], last: int, lo: int, hi: int | None, name: str, n_prev: int,
               pos: int) -> int:
        """``S{lo,hi}`` as llama.cpp rewrites it: S written ``lo`` times, then the optional rest as rules
        ``S' ::= S S' |`` (no maximum) or a chain of ``hi - lo`` of them."""
        if last == len(seq):
            raise self.err("expecting an item before */+/?/{", pos)
        total = hi if hi else lo if lo else 1
        if n_prev * total > MAX_REPEAT:
            raise self.err(f"repetitions of repetitions beyond {MAX_REPEAT} rules", pos)
        prev = seq[last:]
        if lo == 0:
            del seq[last:]
        else:
            seq.extend(prev * (lo - 1))
        self.elements += len(prev) * max(lo - 1, 0)
        n_opt = 1 if hi is None else hi - lo
        last_rec = -1
        for i in range(n_opt):
            rec = self.new_sym(name)
            body = list(prev)
            if hi is None:
                body.append((REF, rec))
            elif i > 0:
                body.append((REF, last_rec))
            self.add(rec, [body, []])
            last_rec = rec
        if n_opt > 0:
            seq.append((REF, last_rec))
        return n_prev * total


@dataclass(eq=False)
class Grammar:
    """A parsed grammar, flattened: position ``p`` holds an element (``kind[p]``: CHAR, REF or END, ``value[p]``),
    each alternative ends with END; ``expand[p]``: the stack tails that replace ``p`` until a CHAR is on top,
    and whether everything from ``p`` to its alternative's end may match nothing."""

    text: str
    kind: list[int] = field(default_factory=list)
    value: list[Any] = field(default_factory=list)
    ascii: list[frozenset[int]] = field(default_factory=list)  # CHAR: the ASCII code points it takes
    expand: list[tuple[tuple[tuple[int, ...], ...], bool]] = field(default_factory=list)
    start: tuple[tuple[int, ...], ...] = ()
    #: (stacks, code point) -> stacks after it: JSON output comes back to the same states all the time (every
    #: character inside a string); bounded, cleared when full
    memo: dict[tuple[Any, int], tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    memo_stacks: int = 0  # stacks held in ``memo``'s values

    def matches(self, p: int, cp: int) -> bool:
        if cp < 128:
            return cp in self.ascii[p]
        neg, ranges = self.value[p]
        return any(lo <= cp <= hi for lo, hi in ranges) != neg

    def may_match(self, p: int, lo: int, hi: int) -> bool:
        """Whether CHAR ``p`` takes some code point in ``lo..hi`` (a partly read UTF-8 character)."""
        neg, ranges = self.value[p]
        if not neg:
            return any(a <= hi and lo <= b for a, b in ranges)
        for a, b in sorted(ranges):  # some code point of lo..hi outside every range
            if a > lo:
                return True
            lo = max(lo, b + 1)
            if lo > hi:
                return False
        return lo <= hi


def parse_grammar(text: str, root: str = "root", max_text: int = MAX_TEXT) -> Grammar:
    """``text`` as a :class:`Grammar` starting at ``root``; :class:`GrammarError` (see the module's docstring).
    ``max_text``: the longest text taken (a grammar compiled from a JSON Schema may be longer than one sent)."""
    if not isinstance(text, str):
        raise GrammarError("a grammar must be text")
    if len(text) > max_text:
        raise GrammarError(f"the grammar is longer than {max_text} characters")
    p = _Parser(text)
    p.parse()
    if root not in p.ids:
        raise GrammarError(f"the grammar has no {root!r} rule")
    g = Grammar(text)
    starts: dict[int, list[int]] = {}
    refs: list[int] = []
    for rid in sorted(p.rules):
        starts[rid] = []
        for alt in p.rules[rid]:
            starts[rid].append(len(g.kind))
            for k, v in alt:
                if k == REF:
                    refs.append(len(g.kind))
                g.kind.append(k)
                g.value.append(v)
            g.kind.append(END)
            g.value.append(None)
    top = len(g.kind)  # the start: one reference to the root
    g.kind += [REF, END]
    g.value += [p.ids[root], None]
    sets: dict[Any, frozenset[int]] = {}
    for i, k in enumerate(g.kind):
        if k == CHAR:
            v = g.value[i]
            got = sets.get(v)
            if got is None:
                neg, ranges = v
                inside = set().union(*(range(lo, min(hi, 127) + 1) for lo, hi in ranges if lo < 128))
                got = sets[v] = frozenset(set(range(128)) - inside if neg else inside)
            g.ascii.append(got)
        else:
            g.ascii.append(frozenset())
    for i in refs:
        g.value[i] = tuple(starts[g.value[i]])
    _left_recursion(p.rules, {v: k for k, v in p.ids.items()})
    g.value[top] = tuple(starts[p.ids[root]])
    _expansions(g)
    tails, nullable = g.expand[top]
    g.start = tuple(dict.fromkeys(tails)) + (((),) if nullable else ())
    return g


def _left_recursion(rules: dict[int, list[list[tuple[int, Any]]]], names: dict[int, str]) -> None:
    """Refuse a rule that can reach itself without output while something waits after it (``r ::= r "a"``):
    its expansion would grow without end. A loop through rules that may match nothing with nothing after it
    (``( [x]* )*``) expands to finitely many stacks and is kept, as llama.cpp does."""
    nullable: set[int] = set()
    changed = True
    while changed:
        changed = False
        for rid, alts in rules.items():
            if rid not in nullable and any(all(k == REF and v in nullable for k, v in alt) for alt in alts):
                nullable.add(rid)
                changed = True
    edges: dict[int, list[tuple[int, bool]]] = {rid: [] for rid in rules}
    for rid, alts in rules.items():
        for alt in alts:
            for i, (k, v) in enumerate(alt):
                if k != REF:
                    break
                edges[rid].append((v, i + 1 < len(alt)))
                if v not in nullable:
                    break
    # Tarjan's strongly connected components, iteratively
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    comp: dict[int, int] = {}
    stack: list[int] = []
    on: set[int] = set()
    for root in rules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            es = edges[v]
            if i < len(es):
                work.append((v, i + 1))
                w = es[i][0]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp[w] = v
                    if w == v:
                        break
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    for rid, es in edges.items():
        for w, push in es:
            if push and comp[w] == comp[rid]:
                raise GrammarError(f"the grammar is left-recursive: {names.get(rid, rid)!r} can reach itself "
                                   "without output")


def _expansions(g: Grammar) -> None:
    """Fill ``g.expand``: for each position, the stack tails (bottom to top, a CHAR on top) it becomes before
    output is read (llama.cpp's advance_stack, once per position here), and whether it may match nothing."""
    kind, n = g.kind, len(g.kind)
    exp: list[tuple[tuple[tuple[int, ...], ...], bool] | None] = [None] * n
    for p in range(n):
        if kind[p] == END:
            exp[p] = ((), True)
        elif kind[p] == CHAR:
            exp[p] = (((p,),), False)
    total = 0
    for p in range(n):
        if kind[p] != REF:
            continue
        tails: dict[tuple[int, ...], None] = {}
        nullable = False
        seen: set[tuple[int, ...]] = set()
        todo: list[tuple[int, ...]] = [(p,)]
        while todo:
            st = todo.pop()
            if st in seen:
                continue
            seen.add(st)
            if not st:
                nullable = True
                continue
            q = st[-1]
            known = exp[q]
            if known is not None:
                tails.update(dict.fromkeys(st[:-1] + t for t in known[0]))
                if known[1]:
                    todo.append(st[:-1])
                continue
            if len(st) > MAX_STACK:
                raise GrammarError("the grammar's rules are nested too deeply")
            base = st[:-1] if kind[q + 1] == END else (*st[:-1], q + 1)
            todo.extend(base if kind[a] == END else (*base, a) for a in g.value[q])
        total += len(seen) + len(tails)
        if len(tails) > MAX_STACKS:
            raise GrammarError(f"a point of the grammar expands to more than {MAX_STACKS} alternatives")
        if total > MAX_EXPANSION:
            raise GrammarError(f"the grammar's rules expand to more than {MAX_EXPANSION} alternatives")
        exp[p] = (tuple(tails), nullable)
    g.expand = [e for e in exp if e is not None]


# ---------------------------------------------------------------------------------------------------- matching
# A state: (grammar, stacks, partial). stacks: a tuple of distinct stacks (tuples of positions, a CHAR on top, the
# positions below it where their rules resume); () among them: the output may end here. partial: None, or the
# UTF-8 character being read as (code point so far, bytes still to come, its smallest valid value).
GState = tuple[Grammar, tuple[tuple[int, ...], ...], tuple[int, int, int] | None]


def initial(g: Grammar) -> GState:
    return (g, g.start, None)


MEMO = 1 << 14  # remembered steps per grammar
MEMO_STACKS = 1 << 16  # stacks in all the steps remembered (a grammar with many parses remembers fewer steps)


def _advance(g: Grammar, stacks: tuple[tuple[int, ...], ...], cp: int) -> tuple[tuple[int, ...], ...]:
    key = (stacks, cp)
    got = g.memo.get(key)
    if got is None:
        got = _advance_all(g, stacks, cp)
        if len(g.memo) >= MEMO or g.memo_stacks + len(got) + len(stacks) > MEMO_STACKS:
            g.memo.clear()
            g.memo_stacks = 0
        g.memo[key] = got
        g.memo_stacks += len(got) + len(stacks)
    return got


def _advance_all(g: Grammar, stacks: tuple[tuple[int, ...], ...], cp: int) -> tuple[tuple[int, ...], ...]:
    out: dict[tuple[int, ...], None] = {}
    expand = g.expand
    for st in stacks:
        if not st or not g.matches(st[-1], cp):
            continue
        prefix, q = st[:-1], st[-1] + 1
        while True:
            tails, null = expand[q]
            for t in tails:
                if len(prefix) + len(t) <= MAX_STACK:
                    out[prefix + t] = None
            if not null:
                break
            if not prefix:
                out[()] = None
                break
            prefix, q = prefix[:-1], prefix[-1]
        if len(out) >= MAX_STACKS:
            break
    return tuple(out)


def step(state: GState, c: int) -> GState | None:
    """The state after byte ``c``; None when the grammar allows no output that continues this way."""
    g, stacks, partial = state
    if partial is None:
        if c < 0x80:
            nxt = _advance(g, stacks, c)
            return (g, nxt, None) if nxt else None
        if 0xC2 <= c <= 0xDF:
            partial = ((c & 0x1F), 1, 0x80)
        elif 0xE0 <= c <= 0xEF:
            partial = ((c & 0x0F), 2, 0x800)
        elif 0xF0 <= c <= 0xF4:
            partial = ((c & 0x07), 3, 0x10000)
        else:
            return None
    else:
        if not 0x80 <= c <= 0xBF:
            return None
        cp, left, least = partial
        cp = (cp << 6) | (c & 0x3F)
        if left == 1:
            if cp < least or 0xD800 <= cp <= 0xDFFF or cp > 0x10FFFF:
                return None
            nxt = _advance(g, stacks, cp)
            return (g, nxt, None) if nxt else None
        partial = (cp, left - 1, least)
    cp, left, least = partial
    lo, hi = max(cp << (6 * left), least), min((cp << (6 * left)) | ((1 << (6 * left)) - 1), 0x10FFFF)
    if lo > hi or not any(st and g.may_match(st[-1], lo, hi) for st in stacks):
        return None
    return (g, stacks, partial)


def feed(state: GState | None, data: bytes) -> GState | None:
    for c in data:
        if state is None:
            return None
        state = step(state, c)
    return state


def can_end(state: GState) -> bool:
    """Whether the output may end here."""
    return state[2] is None and () in state[1]


def closed(state: GState) -> bool:
    """Whether the output is complete and nothing may follow it."""
    return state[2] is None and state[1] == ((),)


def accepts(g: Grammar, text: str | bytes) -> bool:
    """Whether the whole of ``text`` is output of ``g``."""
    st = feed(initial(g), text.encode() if isinstance(text, str) else text)
    return st is not None and can_end(st)
