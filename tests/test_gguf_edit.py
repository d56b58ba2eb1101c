"""Metadata editing (core/gguf/edit.py, `quantscope edit`): the edit model, validation, atomic saving, and byte
identity with gguf-py's gguf_new_metadata.py (run as the oracle on files made here with gguf.GGUFWriter)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core import fsutil
from quantscope.core.gguf import GGUFFile, StringArray, ValueType
from quantscope.core.gguf import edit as E
from quantscope.core.gguf.edit import (
    AddKey,
    DeleteKey,
    EditCancelled,
    EditError,
    EditList,
    SetArrayElement,
    SetChatTemplate,
    SetSpecialToken,
    SetValue,
    TypedValue,
    parse_type,
    parse_value,
    plan_edit,
    save_edited,
)
from quantscope.core.jobs import CancelToken

T = ValueType
VOCAB = ["<s>", "</s>", "<unk>", "hello", "world", "123", "<|im_end|>", "world", "héllo"]
TEMPLATE = "{% for m in messages %}\r\n{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def make_gguf(path: Path, alignment: int | None = None, *, quant: str = "Q4_K", seed: int = 1,
              arch_last: bool = False) -> Path:
    """A small model file: scalars of several types, string/float/int/uint8/bool arrays, a chat template with a
    named variant, special tokens, and F32, Q4_K (or Q8_0), F16 and I32 tensors. ``arch_last`` moves
    general.architecture to the end of the metadata."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint32("llama.context_length", 128)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_key_value("test.i64", -5, T.INT64)
    w.add_key_value("test.u8", 200, T.UINT8)
    w.add_key_value("test.f64", 0.1, T.FLOAT64)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_token_list(VOCAB)
    w.add_token_types([3, 3, 2, 1, 1, 1, 3, 1, 1])
    w.add_token_scores([0.0, -1.5, 0.25, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    w.add_key_value("test.u8s", [1, 2, 255], T.ARRAY, sub_type=T.UINT8)
    w.add_key_value("test.bools", [True, False, True], T.ARRAY, sub_type=T.BOOL)
    w.add_eos_token_id(1)
    w.add_chat_template("{{ messages }}")
    w.add_string("tokenizer.chat_template.tool_use", "{{ tools }}")
    w.add_array("tokenizer.chat_templates", ["tool_use"])
    w.add_string("general.url", "https://example.org/model")
    if arch_last:
        kv = w.kv_data[0]
        kv["general.architecture"] = kv.pop("general.architecture")
    rng = np.random.default_rng(seed)
    w.add_tensor("token_embd.weight", rng.standard_normal((9, 32)).astype(np.float32))
    qt = getattr(gguf.GGMLQuantizationType, quant)
    _, size = gguf.GGML_QUANT_SIZES[qt]
    q = rng.integers(0, 256, size=(3, 2 * size), dtype=np.uint8)
    w.add_tensor("blk.0.ffn_up.weight", q, raw_dtype=qt)
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal((7,)).astype(np.float16))
    w.add_tensor("pos", np.arange(5, dtype=np.int32))
    w.add_tensor("output.weight", rng.standard_normal((2, 16)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tensor_hashes(path: Path) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    with GGUFFile(path) as f:
        return {t.name: (t.type_name, hashlib.sha256(f.tensor_bytes(t).tobytes()).hexdigest(), t.ne)
                for t in f.tensors}


def oracle(src: Path, dst: Path, *args: str) -> Path:
    """gguf-py's gguf_new_metadata.py, the script itself, on ``src``."""
    cmd = [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(src), str(dst), *args, "--force"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return dst


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["edit", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return make_gguf(tmp_path / "in.gguf")


# ------------------------------------------------------------------------------------------ byte identity (oracle)
CASES = {
    "name": (["--general-name", "Renamed"], ["--set", "general.name=Renamed"]),
    "new-description": (["--general-description", "A new description ✓"],
                         ["--set", "general.description=A new description ✓"]),
    "chat-template": (["--chat-template-file", "{tpl}"], ["--chat-template-file", "{tpl}"]),
    "special-by-text": (["--special-token", "eos", "<|im_end|>", "--special-token", "padding", "world"],
                        ["--special-token", "eos=<|im_end|>", "--special-token", "pad=world"]),
    "special-by-id": (["--special-token-by-id", "bos", "0", "--special-token-by-id", "eot", "6"],
                      ["--special-token", "bos=0", "--special-token", "eot=6"]),
    "pre-tokenizer": (["--pre-tokenizer", "qwen2", "--general-name", "n"],
                      ["--set", "general.name=n", "--set", "tokenizer.ggml.pre=qwen2"]),
    "remove": (["--remove-metadata", "test.i64", "--remove-metadata", "general.url"],
               ["--delete", "test.i64", "--delete", "general.url"]),
    "remove-and-set": (["--remove-metadata", "general.name", "--general-name", "moved to the end"],
                       ["--delete", "general.name", "--set", "general.name=moved to the end"]),
    "everything": (["--general-name", "N", "--general-description", "D", "--chat-template-file", "{tpl}",
                    "--special-token", "eos", "héllo", "--special-token-by-id", "unknown", "2",
                    "--remove-metadata", "test.f64"],
                   ["--set", "general.name=N", "--set", "general.description=D", "--chat-template-file", "{tpl}",
                    "--special-token", "eos=héllo", "--special-token", "unk=2", "--delete", "test.f64"]),
}


@pytest.mark.parametrize("alignment", [None, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_bytes_as_gguf_new_metadata(tmp_path, capsys, case, alignment):
    src = make_gguf(tmp_path / "in.gguf", alignment)
    tpl = tmp_path / "tpl.jinja"
    tpl.write_bytes(TEMPLATE.encode("utf-8"))
    o_args, q_args = ([a.replace("{tpl}", str(tpl)) for a in args] for args in CASES[case])
    ref = oracle(src, tmp_path / "oracle.gguf", *o_args)
    rc, _, err = cli(capsys, src, "-o", tmp_path / "ours.gguf", *q_args)
    assert rc == 0, err
    assert sha(tmp_path / "ours.gguf") == sha(ref)
    assert tensor_hashes(tmp_path / "ours.gguf") == tensor_hashes(src)


def test_architecture_is_written_first_as_gguf_py_does(tmp_path, capsys):
    src = make_gguf(tmp_path / "in.gguf", arch_last=True)
    with GGUFFile(src) as f:
        assert list(f.metadata)[-1] == "general.architecture"
    ref = oracle(src, tmp_path / "oracle.gguf", "--general-name", "x")
    rc, _, err = cli(capsys, src, "-o", tmp_path / "ours.gguf", "--set", "general.name=x")
    assert rc == 0, err
    assert sha(tmp_path / "ours.gguf") == sha(ref)
    with GGUFFile(tmp_path / "ours.gguf") as g:
        assert next(iter(g.metadata)) == "general.architecture"


def test_core_api_matches_the_oracle_and_the_cli(tmp_path, capsys):
    src = make_gguf(tmp_path / "in.gguf", 128, quant="Q8_0")
    ops = [SetValue("general.name", TypedValue(T.STRING, "API")), SetChatTemplate("{{ x }}"),
           SetSpecialToken("eos", "world"), DeleteKey("test.u8")]
    res = save_edited(src, tmp_path / "api.gguf", ops)
    ref = oracle(src, tmp_path / "oracle.gguf", "--general-name", "API", "--chat-template", "{{ x }}",
                 "--special-token", "eos", "world", "--remove-metadata", "test.u8")
    assert sha(res.path) == sha(ref)
    assert res.plan.file_bytes == os.path.getsize(ref)
    assert res.plan.warnings == ["token 'world' has 2 ids (4, 7); eos uses the first, 4"]


def test_copy_without_copy_file_range_is_identical(tmp_path, model, monkeypatch):
    ops = [SetValue("general.name", TypedValue(T.STRING, "x"))]
    a = save_edited(model, tmp_path / "a.gguf", ops).path
    monkeypatch.setattr(E, "USE_COPY_FILE_RANGE", False)
    b = save_edited(model, tmp_path / "b.gguf", ops).path
    with GGUFFile(bytes(model.read_bytes())) as mem:  # an in-memory source is copied from its buffer
        c = save_edited(mem, tmp_path / "c.gguf", ops).path
    assert sha(a) == sha(b) == sha(c)


# ------------------------------------------------------------------------------------------------ edit semantics
def test_result_order_rules(model):
    with GGUFFile(model) as f:
        original = list(f.metadata)
        el = EditList(f)
        el.apply(SetValue("llama.context_length", TypedValue(T.UINT32, 4096)))  # in place
        el.apply(AddKey("zz.first_new", TypedValue(T.STRING, "a")))
        el.apply(DeleteKey("test.i64"))
        el.apply(SetValue("aa.second_new", TypedValue(T.ARRAY, [1.5, 2], T.FLOAT32)))
        el.apply(SetChatTemplate("{{ t }}"))  # as gguf_new_metadata: first among the added keys
        keys = [e.key for e in el.entries()]
        kept = [k for k in original if k != "test.i64" and not k.startswith("tokenizer.chat_template")]
        assert keys == [*kept, "tokenizer.chat_template", "zz.first_new", "aa.second_new"]
        status = {e.key: e.status for e in el.entries()}
        assert status["llama.context_length"] == "changed" and status["zz.first_new"] == "added"
        assert status["general.name"] == "kept" and status["tokenizer.chat_template"] == "changed"
        assert el.state.deleted() == ["test.i64", "tokenizer.chat_template.tool_use", "tokenizer.chat_templates"]
        assert el.state.value("aa.second_new") == (1.5, 2.0)
        assert keys[0] == "general.architecture"


def test_undo_redo_moves_a_cursor(model):
    with GGUFFile(model) as f:
        el = EditList(f)
        assert not el.can_undo and el.undo() is None
        a = SetValue("general.name", TypedValue(T.STRING, "one"))
        b = SetValue("general.name", TypedValue(T.STRING, "two"))
        c = DeleteKey("general.url")
        for op in (a, b, c):
            el.apply(op)
        assert el.state.value("general.name") == "two" and "general.url" not in el.state
        assert el.undo() is c and "general.url" in el.state
        assert el.undo() is b and el.state.value("general.name") == "one"
        assert el.ops == (a,) and el.undone == (b, c) and el.can_redo
        assert el.redo() is b and el.state.value("general.name") == "two"
        assert el.undo() is b and el.undo() is a and el.state.value("general.name") == "tiny"
        assert el.undo() is None and el.entries()[1].status == "kept"
        assert el.redo() is a
        d = AddKey("x.new", TypedValue(T.BOOL, False))
        el.apply(d)  # a new edit drops the undone ones
        assert el.ops == (a, d) and el.undone == () and el.redo() is None
        # the plan follows the cursor
        el.undo()
        assert "x.new" not in [e.key for e in plan_edit(f, el).entries]


def test_failed_apply_changes_nothing(model):
    with GGUFFile(model) as f:
        el = EditList(f, [SetValue("general.name", TypedValue(T.STRING, "kept"))])
        with pytest.raises(EditError):
            el.apply(DeleteKey("no.such.key"))
        assert len(el) == 1 and el.state.value("general.name") == "kept"


def test_string_array_element_edit(tmp_path, model):
    with GGUFFile(model) as f:
        el = EditList(f)
        el.apply(SetArrayElement("tokenizer.ggml.tokens", 3, "bonjour ✓"))
        el.apply(SetArrayElement("tokenizer.ggml.tokens", -1 + 9, "last"))
        el.apply(SetArrayElement("tokenizer.ggml.scores", 0, 0.5))
        el.apply(SetArrayElement("test.bools", 1, True))
        el.apply(SetSpecialToken("bos", "bonjour ✓"))  # the edited vocabulary is what tokens are looked up in
        out = save_edited(f, tmp_path / "o.gguf", el).path
    r = gguf.GGUFReader(out)
    assert r.get_field("tokenizer.ggml.tokens").contents() == [*VOCAB[:3], "bonjour ✓", *VOCAB[4:8], "last"]
    assert r.get_field("tokenizer.ggml.scores").contents()[:2] == [0.5, -1.5]
    assert r.get_field("test.bools").contents() == [True, True, True]
    assert r.get_field("tokenizer.ggml.bos_token_id").contents() == 3
    with GGUFFile(out) as g:
        assert isinstance(g.get("tokenizer.ggml.tokens"), StringArray)
        assert g.get("tokenizer.ggml.tokens")[3] == "bonjour ✓"
    assert tensor_hashes(out) == tensor_hashes(model)


def test_set_array_and_numeric_types_round_trip(tmp_path, model):
    ops = [SetValue("a.u64", TypedValue(T.UINT64, 2**64 - 1)), SetValue("a.i8", TypedValue(T.INT8, -128)),
           SetValue("a.f32", TypedValue(T.FLOAT32, 0.1)), SetValue("a.strs", TypedValue(T.ARRAY, ["x", ""], T.STRING)),
           SetValue("a.i16s", TypedValue(T.ARRAY, np.array([-3, 4], np.int64), T.INT16)),
           SetValue("a.empty", TypedValue(T.ARRAY, [], T.UINT32)),
           SetValue("test.u8s", TypedValue(T.ARRAY, [9], T.UINT8))]
    out = save_edited(model, tmp_path / "o.gguf", ops).path
    with GGUFFile(out) as g:
        assert g.metadata["a.u64"].type == T.UINT64 and g.get("a.u64") == 2**64 - 1
        assert g.get("a.i8") == -128 and g.get("a.f32") == np.float32(0.1)
        assert g.get("a.strs").to_list() == ["x", ""]
        assert g.metadata["a.i16s"].elem_type == T.INT16 and g.get("a.i16s").tolist() == [-3, 4]
        assert g.metadata["a.empty"].count == 0
        assert g.get("test.u8s").tolist() == [9]


def test_alignment_change_realigns_tensors(tmp_path):
    src = make_gguf(tmp_path / "in.gguf", 64)
    before = tensor_hashes(src)
    for op, want in ((SetValue("general.alignment", TypedValue(T.UINT32, 256)), 256), (DeleteKey("general.alignment"),
                                                                                       32)):
        res = save_edited(src, tmp_path / f"o{want}.gguf", [op])
        assert res.plan.realigned and res.plan.alignment == want
        with GGUFFile(res.path) as g:
            assert g.alignment == want and all(t.offset % want == 0 for t in g.tensors)
        assert tensor_hashes(res.path) == before
        r = gguf.GGUFReader(res.path)  # gguf-py reads the same data
        with GGUFFile(src) as f:
            for t in r.tensors:
                assert t.data.tobytes() == f.tensor_bytes(t.name).tobytes()


def test_deleting_the_alignment_where_the_oracle_breaks_the_file(tmp_path):
    """gguf_new_metadata.py drops general.alignment but keeps the old layout (readers then misread the data); the
    edited file here is laid out for the default 32 and reads back the same tensors."""
    def llama_cpp_layout(path: Path) -> bool:  # llama.cpp's check: offset i = padded sizes of tensors before i
        with GGUFFile(path) as f:
            want = np.cumsum([0] + [-(-(t.n_bytes or 0) // f.alignment) * f.alignment for t in f.tensors])
            return [t.offset for t in f.tensors] == want[:-1].tolist()

    src = make_gguf(tmp_path / "in.gguf", 256)
    ref = oracle(src, tmp_path / "oracle.gguf", "--remove-metadata", "general.alignment")
    ours = save_edited(src, tmp_path / "ours.gguf", [DeleteKey("general.alignment")]).path
    assert tensor_hashes(ours) == tensor_hashes(src) and llama_cpp_layout(ours) and llama_cpp_layout(src)
    assert not llama_cpp_layout(ref)  # the script's offsets are padded to 256 in a file that says 32


# --------------------------------------------------------------------------------------------------- hostile edits
HOSTILE = [
    (lambda: SetValue("test.u8", TypedValue(T.UINT8, 256)), "out of range for UINT8"),
    (lambda: SetValue("x", TypedValue(T.INT8, -129)), "out of range for INT8"),
    (lambda: SetValue("x", TypedValue(T.UINT64, 2**64)), "out of range for UINT64"),
    (lambda: SetValue("x", TypedValue(T.UINT32, -1)), "out of range for UINT32"),
    (lambda: SetValue("x", TypedValue(T.UINT32, "7")), "needs an integer"),
    (lambda: SetValue("x", TypedValue(T.INT32, True)), "needs an integer"),
    (lambda: SetValue("x", TypedValue(T.INT32, 1.0)), "needs an integer"),
    (lambda: SetValue("x", TypedValue(T.BOOL, 1)), "BOOL needs true or false"),
    (lambda: SetValue("x", TypedValue(T.FLOAT32, float("nan"))), "not a finite number"),
    (lambda: SetValue("x", TypedValue(T.FLOAT32, 1e39)), "out of range for FLOAT32"),
    (lambda: SetValue("x", TypedValue(T.STRING, "\ud800")), "lone surrogate"),
    (lambda: SetValue("x", TypedValue(T.STRING, 5)), "STRING needs text"),
    (lambda: SetValue("x", TypedValue(99, 5)), "unknown value type"),
    (lambda: SetValue("x", TypedValue(T.ARRAY, [1])), "needs an element type"),
    (lambda: SetValue("x", TypedValue(T.ARRAY, [[1]], T.ARRAY)), "arrays of arrays"),
    (lambda: SetValue("x", TypedValue(T.ARRAY, "abc", T.STRING)), "must be a list"),
    (lambda: SetValue("x", TypedValue(T.ARRAY, [1, 300], T.UINT8)), "[1]: 300 is out of range"),
    (lambda: SetValue("x", TypedValue(T.ARRAY, E.ArrayPatch([1, 2], {0: "a"}), T.UINT8)), "needs an integer"),
    (lambda: SetValue("x", TypedValue(T.ARRAY, E.ArrayPatch([1, 2], {2: 1}), T.UINT8)), "index 2 is out of range"),
    (lambda: SetValue("x", TypedValue(T.ARRAY, E.ArrayPatch(["a", 2], {0: "b"}), T.STRING)), "STRING needs text"),
    (lambda: SetValue("general.alignment", TypedValue(T.UINT32, 12)), "power of two, a multiple of 8"),
    (lambda: SetValue("general.alignment", TypedValue(T.UINT32, 4)), "power of two, a multiple of 8"),
    (lambda: SetValue("general.alignment", TypedValue(T.UINT32, 1 << 25)), "at most"),
    (lambda: SetValue("general.alignment", TypedValue(T.UINT64, 64)), "must be UINT32"),
    (lambda: SetValue("general.architecture", TypedValue(T.STRING, "")), "non-empty name"),
    (lambda: SetValue("general.architecture", TypedValue(T.STRING, "a.b")), "without dots"),
    (lambda: SetValue("tokenizer.ggml.tokens", TypedValue(T.ARRAY, [1], T.INT32)), "must be ARRAY[STRING]"),
    (lambda: SetValue("tokenizer.ggml.eos_token_id", TypedValue(T.UINT32, 9)), "vocabulary has 9 tokens"),
    (lambda: SetValue("tokenizer.ggml.eos_token_id", TypedValue(T.INT32, 1)), "must be UINT32"),
    (lambda: SetValue("k" * 65536, TypedValue(T.STRING, "v")), "65,536 bytes long; at most 65,535"),
    (lambda: SetValue("", TypedValue(T.STRING, "v")), "non-empty"),
    (lambda: SetValue("bad\x1bkey", TypedValue(T.STRING, "v")), "control or invisible"),
    (lambda: SetValue("bad\u202ekey", TypedValue(T.STRING, "v")), "control or invisible"),
    (lambda: SetValue(" padded", TypedValue(T.STRING, "v")), "white space"),
    (lambda: SetValue("GGUF.version", TypedValue(T.STRING, "v")), "virtual header fields"),
    (lambda: SetValue("split.count", TypedValue(T.UINT16, 2)), "split into files"),
    (lambda: AddKey("general.name", TypedValue(T.STRING, "v")), "already exists"),
    (lambda: DeleteKey("no.such.key"), "no key no.such.key to delete"),
    (lambda: DeleteKey("general.architecture"), "cannot be deleted"),
    (lambda: SetArrayElement("tokenizer.ggml.tokens", 9, "x"), "index 9 is out of range"),
    (lambda: SetArrayElement("tokenizer.ggml.tokens", 0, 5), "STRING needs text"),
    (lambda: SetArrayElement("general.name", 0, "x"), "not an array"),
    (lambda: SetArrayElement("missing", 0, "x"), "there is no key"),
    (lambda: SetChatTemplate(""), "empty"),
    (lambda: SetSpecialToken("bogus", 1), "unknown special token 'bogus'"),
    (lambda: SetSpecialToken("eos", "<not-a-token>"), "no token '<not-a-token>'"),
    (lambda: SetSpecialToken("eos", 9), "out of range: the vocabulary has 9 tokens"),
    (lambda: SetSpecialToken("eos", -1), "out of range"),
]


@pytest.mark.parametrize("make_op,message", HOSTILE, ids=[m for _, m in HOSTILE])
def test_hostile_edits_are_refused(model, make_op, message):
    with GGUFFile(model) as f:
        el = EditList(f)
        with pytest.raises(EditError) as exc:
            el.apply(make_op())
        assert message in str(exc.value)
        assert len(el) == 0 and [e.key for e in el.entries()] == list(f.metadata)


def test_replaying_an_invalid_list_names_the_edit(tmp_path, model):
    with pytest.raises(EditError, match=r"edit 2 \(delete general.url\): there is no key general.url"):
        save_edited(model, tmp_path / "o.gguf", [DeleteKey("general.url"), DeleteKey("general.url")])
    assert not (tmp_path / "o.gguf").exists()


def test_special_token_needs_a_vocabulary(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "novocab.gguf"), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(tmp_path / "novocab.gguf") as f:
        with pytest.raises(EditError, match=r"no tokenizer\.ggml\.tokens"):
            EditList(f).apply(SetSpecialToken("eos", 0))
        el = EditList(f, [SetValue("tokenizer.ggml.eos_token_id", TypedValue(T.UINT32, 7))])  # explicit: allowed
        res = save_edited(f, tmp_path / "o.gguf", el)
    # a file without tensors ends after its tensor infos, as gguf-py writes it
    ref = oracle(tmp_path / "novocab.gguf", tmp_path / "ref.gguf", "--general-name", "n")
    mine = save_edited(tmp_path / "novocab.gguf", tmp_path / "mine.gguf",
                       [SetValue("general.name", TypedValue(T.STRING, "n"))]).path
    assert sha(mine) == sha(ref)
    with GGUFFile(res.path) as g:
        assert g.get("tokenizer.ggml.eos_token_id") == 7


def test_parse_type_and_value():
    assert parse_type("uint32") == (T.UINT32, None) and parse_type("ARRAY[string]") == (T.ARRAY, T.STRING)
    for bad in ("FOO", "ARRAY", "ARRAY[ARRAY]", "ARRAY[X]"):
        with pytest.raises(EditError):
            parse_type(bad)
    assert parse_value("0x10", T.UINT8).value == 16 and parse_value("-0x10", T.INT8).value == -16
    assert parse_value(" 42 ", T.INT64).value == 42 and parse_value("TRUE", T.BOOL).value is True
    assert parse_value("1e3", T.FLOAT32).value == 1000.0 and parse_value(" a b ", T.STRING).value == " a b "
    assert parse_value('["a", "b"]', T.ARRAY, T.STRING).value == ("a", "b")
    assert parse_value("[1, 2.5]", T.ARRAY, T.FLOAT64).value == (1.0, 2.5)
    for text, vt, et, msg in (("256", T.UINT8, None, "out of range"), ("1.5", T.INT32, None, "not an integer"),
                              ("yes", T.BOOL, None, "not a BOOL"), ("inf", T.FLOAT64, None, "not a finite"),
                              ("x", T.FLOAT32, None, "not a number"), ("[1,", T.ARRAY, T.INT32, "JSON list"),
                              ('{"a": 1}', T.ARRAY, T.INT32, "JSON list"), ("[1.5]", T.ARRAY, T.INT32, "integer"),
                              ("--5", T.INT32, None, "not an integer"), ("1 2", T.INT32, None, "not an integer"),
                              ("[1e999]", T.ARRAY, T.FLOAT32, "finite"), (f"[{10**400}]", T.ARRAY, T.FLOAT64,
                                                                          "out of range")):
        with pytest.raises(EditError, match=msg):
            parse_value(text, vt, et)


# --------------------------------------------------------------------------------------------------- saving safely
def test_refuses_to_overwrite_the_input(tmp_path, model):
    before = sha(model)
    op = [SetValue("general.name", TypedValue(T.STRING, "x"))]
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    hard = tmp_path / "hard.gguf"
    os.link(model, hard)
    for dst in (model, link, hard, tmp_path / "." / "in.gguf"):
        with pytest.raises(fsutil.PathRefused, match="is the input file"):
            save_edited(model, dst, op)
    assert sha(model) == before and sorted(p.name for p in tmp_path.iterdir()) == ["hard.gguf", "in.gguf",
                                                                                    "link.gguf"]


def test_overwrite_source_goes_through_a_rename(tmp_path, model):
    ino = model.stat().st_ino
    tensors = tensor_hashes(model)
    with GGUFFile(model) as f:  # the open file keeps reading the old inode while the new one replaces it
        res = save_edited(f, model, [SetValue("general.name", TypedValue(T.STRING, "in place"))],
                          overwrite_source=True)
        assert f.get("general.name") == "tiny"
    assert res.path == model.resolve() and model.stat().st_ino != ino
    with GGUFFile(model) as g:
        assert g.get("general.name") == "in place"
    assert tensor_hashes(model) == tensors
    assert [p.name for p in tmp_path.iterdir()] == ["in.gguf"]


def test_cli_force_replaces_the_input_through_a_rename(tmp_path, capsys, model):
    ino = model.stat().st_ino
    tensors = tensor_hashes(model)
    rc, _, err = cli(capsys, model, "-o", model, "--set", "general.name=x")
    assert rc == 2 and "is the input file" in err and "--force" in err and err.count("\n") == 1
    rc, out, err = cli(capsys, model, "-o", model, "--set", "general.name=forced", "--force")
    assert rc == 0, err
    assert model.stat().st_ino != ino and "wrote" in out
    with GGUFFile(model) as g:
        assert g.get("general.name") == "forced"
    assert tensor_hashes(model) == tensors
    assert [p.name for p in tmp_path.iterdir()] == ["in.gguf"]


def test_cancel_leaves_nothing(tmp_path, model, monkeypatch):
    monkeypatch.setattr(E, "COPY_CHUNK", 64)  # many chunks, so the cancel lands inside the tensor copy
    existing = tmp_path / "existing.gguf"
    existing.write_bytes(b"old content")
    for dst in (tmp_path / "new.gguf", existing):
        tok = CancelToken()
        calls = []

        def progress(done, total, tok=tok, calls=calls):
            calls.append((done, total))
            if len(calls) == 3:
                tok.cancel()

        with pytest.raises(EditCancelled):
            save_edited(model, dst, [SetValue("general.name", TypedValue(T.STRING, "x"))], progress=progress,
                        cancel=tok)
        assert len(calls) == 3 and calls[-1][0] < calls[-1][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.gguf", "in.gguf"]
    assert existing.read_bytes() == b"old content"


def test_a_failed_write_leaves_nothing(tmp_path, model, monkeypatch):
    def broken(*a, **k):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "copy_file_range", broken)
    with pytest.raises(OSError):
        save_edited(model, tmp_path / "o.gguf", [])
    assert [p.name for p in tmp_path.iterdir()] == ["in.gguf"]


def test_progress_counts_every_output_byte(tmp_path, model, monkeypatch):
    monkeypatch.setattr(E, "COPY_CHUNK", 100)
    seen = []
    res = save_edited(model, tmp_path / "o.gguf", [], progress=lambda d, t: seen.append((d, t)))
    size = os.path.getsize(res.path)
    assert seen[-1] == (size, size) and all(t == size for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) > 5


def test_changed_input_is_refused(tmp_path, model):
    with GGUFFile(model) as f:
        data = bytearray(model.read_bytes())
        data[30] ^= 1  # inside the first key: same size, other header
        (tmp_path / "swap").write_bytes(data)
        os.replace(tmp_path / "swap", model)
        with pytest.raises(EditError, match="changed since it was opened"):
            save_edited(f, tmp_path / "o.gguf", [])
    assert not (tmp_path / "o.gguf").exists()


def test_unreadable_tensor_is_refused(tmp_path, model):
    data = bytearray(model.read_bytes())
    with GGUFFile(model) as f:
        t = f.tensors[-1]
        end = t.data_offset
    (tmp_path / "cut.gguf").write_bytes(data[: end + 8])  # the last tensor runs past the end
    with GGUFFile(tmp_path / "cut.gguf", strict=False) as f:
        with pytest.raises(EditError, match=r"output\.weight cannot be copied"):
            plan_edit(f, [])


def test_non_canonical_layout_is_laid_out_as_llama_cpp_requires(tmp_path, model):
    """Tensor data out of info order (legal for our reader, refused by llama.cpp): the output puts every tensor at
    its canonical offset, with the same bytes per tensor."""
    data = bytearray(model.read_bytes())
    with GGUFFile(model) as f:
        a, b = f.tensor("blk.0.attn_norm.weight"), f.tensor("pos")

        def offset_field(t):
            return t.info_offset + 8 + len(t.name.encode()) + 4 + 8 * len(t.ne) + 4

        oa, ob = offset_field(a), offset_field(b)
        data[oa:oa + 8], data[ob:ob + 8] = data[ob:ob + 8], data[oa:oa + 8]
    swapped = tmp_path / "swapped.gguf"
    swapped.write_bytes(data)
    with GGUFFile(swapped) as f:
        assert f.tensor("pos").offset < f.tensor("blk.0.attn_norm.weight").offset
    out = save_edited(swapped, tmp_path / "o.gguf", []).path
    assert tensor_hashes(out) == tensor_hashes(swapped)
    with GGUFFile(out) as g:
        offs = [t.offset for t in g.tensors]
        assert offs == sorted(offs) and g.tensor("pos").offset > g.tensor("blk.0.attn_norm.weight").offset
    r = gguf.GGUFReader(out)
    assert [t.data_offset for t in r.tensors] == sorted(t.data_offset for t in r.tensors)


def test_f32_and_q4k_tensors_survive_byte_for_byte(tmp_path, model):
    out = save_edited(model, tmp_path / "o.gguf", [SetValue("general.name", TypedValue(T.STRING, "y"))]).path
    a, b = tensor_hashes(model), tensor_hashes(out)
    assert a == b and {v[0] for v in b.values()} >= {"F32", "Q4_K"}
    r = gguf.GGUFReader(out)  # and gguf-py agrees
    assert [t.name for t in r.tensors] == list(a)


# ------------------------------------------------------------------------------------------------------------- CLI
def test_cli_set_infers_types(tmp_path, capsys, model):
    out = tmp_path / "o.gguf"
    rc, text, err = cli(capsys, model, "-o", out, "--set", "test.u8=7", "--set", "llama.rope.freq_base=5e5",
                        "--set", "test.u8s=[3, 4]", "--set", "llama.embedding_length=896", "--set", "my.key=12",
                        "--set", "tokenizer.ggml.add_bos_token=false", "--set-typed", "my.f=FLOAT64:2.5",
                        "--set-typed", "my.list=ARRAY[STRING]:[\"a\", \"b\"]", "--special-token", "pad=text:123")
    assert rc == 0, err
    with GGUFFile(out) as g:
        md = g.metadata
        assert (md["test.u8"].type, g.get("test.u8")) == (T.UINT8, 7)
        assert md["llama.rope.freq_base"].type == T.FLOAT32 and g.get("llama.rope.freq_base") == 5e5
        assert md["test.u8s"].elem_type == T.UINT8 and g.get("test.u8s").tolist() == [3, 4]
        assert md["llama.embedding_length"].type == T.UINT32  # a new key llama.cpp reads as UINT32
        assert (md["my.key"].type, g.get("my.key")) == (T.STRING, "12")  # unknown new key: STRING
        assert g.get("tokenizer.ggml.add_bos_token") is False
        assert md["my.f"].type == T.FLOAT64 and g.get("my.list").to_list() == ["a", "b"]
        assert g.get("tokenizer.ggml.padding_token_id") == 5
    assert "changed  test.u8" in text and "added    my.key" in text


def test_cli_dry_run_json(tmp_path, capsys, model):
    import json

    rc, out, err = cli(capsys, model, "-o", tmp_path / "o.gguf", "--dry-run", "--json", "--delete", "general.url",
                       "--set-typed", "general.alignment=UINT32:128")
    assert rc == 0, err
    d = json.loads(out)
    assert d["dry_run"] and d["realigned"] and d["alignment"] == {"before": 32, "after": 128}
    assert {c["key"]: c["status"] for c in d["changes"]} == {"general.alignment": "added", "general.url": "deleted"}
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("argv,message", [
    ((), "output path is missing"),
    (("-o", "{out}", "--set", "novalue"), "is not KEY=VALUE"),
    (("-o", "{out}", "--set-typed", "k=7"), "is not KEY=TYPE:VALUE"),
    (("-o", "{out}", "--set-typed", "k=FOO:7"), "unknown value type"),
    (("-o", "{out}", "--set", "test.u8=300"), "out of range for UINT8"),
    (("-o", "{out}", "--delete", "missing.key"), "no key missing.key"),
    (("-o", "{out}", "--special-token", "eos=nope"), "no token 'nope'"),
    (("-o", "{out}", "--special-token", "eos=99"), "out of range"),
    (("-o", "{out}", "--chat-template-file", "{dir}"), "directory"),
    (("-o", "{exists}"), "exists; pass --force"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, model, argv, message):
    (tmp_path / "exists.gguf").write_bytes(b"x")
    args = [a.format(out=tmp_path / "o.gguf", dir=tmp_path, exists=tmp_path / "exists.gguf") for a in argv]
    rc, _, err = cli(capsys, model, *args)
    assert rc == 2 and err.startswith("quantscope: error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o.gguf").exists() and (tmp_path / "exists.gguf").read_bytes() == b"x"


def test_cli_edits_apply_in_command_line_order(tmp_path, capsys, model):
    out = tmp_path / "o.gguf"
    rc, _, err = cli(capsys, model, "-o", out, "--set", "general.name=a", "--delete", "general.name")
    assert rc == 0, err
    with GGUFFile(out) as g:
        assert "general.name" not in g.metadata


@pytest.mark.models
@pytest.mark.slow
def test_real_model_same_bytes_as_the_oracle(tmp_path, capsys, model_path):
    src = model_path("smollm2")
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    ref = oracle(src, tmp_path / "oracle.gguf", "--general-name", "edited", "--chat-template-file", str(tpl),
                 "--special-token-by-id", "eos", "2")
    rc, _, err = cli(capsys, src, "-o", tmp_path / "ours.gguf", "--set", "general.name=edited",
                     "--chat-template-file", tpl, "--special-token", "eos=2")
    assert rc == 0, err
    assert sha(tmp_path / "ours.gguf") == sha(ref)
