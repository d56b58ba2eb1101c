"""Well-known metadata keys stored with the wrong type (``general.architecture`` as UINT32, the vocabulary as a
number, ``general.name`` as an array…): ``edit``, ``inspect``, ``diff`` and ``tokenize`` give a result or one
``quantscope: error: …`` line naming the key and its type, never an internal error."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.gguf import GGUFFile, ValueType
from quantscope.core.gguf.checks import metadata_checks
from quantscope.core.gguf.edit import EditError, EditList, SetValue, TypedValue

T = gguf.GGUFValueType
#: the value each wrong type is written with
WRONG = {"UINT32": (7, T.UINT32, None), "STRING": ("7", T.STRING, None), "FLOAT32": (1.5, T.FLOAT32, None),
         "ARRAY[STRING]": (["a", "b"], T.ARRAY, T.STRING), "ARRAY[INT32]": ([1, 2], T.ARRAY, T.INT32)}
#: each key's right type (the one llama.cpp reads)
RIGHT = {"general.architecture": "STRING", "tokenizer.ggml.tokens": "ARRAY[STRING]", "general.name": "STRING",
         "general.file_type": "UINT32", "tokenizer.ggml.eos_token_id": "UINT32", "tokenizer.chat_template": "STRING",
         "llama.context_length": "UINT32", "tokenizer.ggml.model": "STRING"}


def write(path: Path, key: str, wrong: str) -> Path:
    """A one-tensor file (with a three-token vocabulary unless ``key`` is the vocabulary) where ``key`` has the
    type ``wrong``."""
    val, typ, sub = WRONG[wrong]
    w = gguf.GGUFWriter(str(path), "llama")
    if key == "general.architecture":
        w.kv_data[0].pop("general.architecture")
    else:
        w.add_token_list(["<s>", "</s>", "a"])
    w.add_key_value(key, val, typ, sub_type=sub)
    w.add_tensor("token_embd.weight", np.ones((3, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run(capsys, *argv: object) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def clean(rc: int, err: str) -> None:
    """Success, or exactly one ``quantscope: error:`` line (exit 2) that is not an internal error."""
    assert "internal error" not in err and "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("quantscope:")]
    assert rc == 0 or (rc == 2 and len(errors) == 1 and errors[0].startswith("quantscope: error:")), (rc, err)


def test_architecture_as_uint32_is_refused_in_one_line(tmp_path, capsys):
    src = write(tmp_path / "in.gguf", "general.architecture", "UINT32")
    out = tmp_path / "o.gguf"
    rc, _, err = run(capsys, "edit", src, "-o", out, "--set", "general.architecture=7")
    assert rc == 2 and err.startswith("quantscope: error:") and err.count("\n") == 1, err
    assert "general.architecture must be STRING" in err and "UINT32" in err and "--set-typed" in err
    assert not out.exists()
    rc, _, err = run(capsys, "edit", src, "-o", out, "--set-typed", "general.architecture=STRING:llama")
    assert rc == 0, err
    with GGUFFile(out) as g:
        assert g.architecture == "llama"


def test_vocabulary_as_uint32_keeps_its_type_with_a_warning(tmp_path, capsys):
    src = write(tmp_path / "in.gguf", "tokenizer.ggml.tokens", "UINT32")
    out = tmp_path / "o.gguf"
    rc, _, err = run(capsys, "edit", src, "-o", out, "--set", "tokenizer.ggml.tokens=5")
    assert rc == 0, err
    assert "tokenizer.ggml.tokens keeps its type UINT32" in err and "ARRAY[STRING]" in err
    with GGUFFile(out) as g:
        kv = g.metadata["tokenizer.ggml.tokens"]
        assert kv.type == ValueType.UINT32 and kv.value == 5
    rc, _, err = run(capsys, "edit", src, "-o", out, "--force", "--set", 'tokenizer.ggml.tokens=["x"]')
    assert rc == 2 and "not an integer" in err and "--set-typed tokenizer.ggml.tokens=ARRAY[STRING]" in err
    rc, _, err = run(capsys, "edit", src, "-o", out, "--force", "--special-token", "eos=1")
    assert rc == 2 and "no tokenizer.ggml.tokens" in err and err.count("\n") == 1


def test_core_edit_checks_the_type_before_the_value(tmp_path):
    with GGUFFile(write(tmp_path / "a.gguf", "general.architecture", "FLOAT32")) as f:
        edits = EditList(f)
        with pytest.raises(EditError, match=r"general\.architecture must be STRING"):
            edits.apply(SetValue("general.architecture", TypedValue(ValueType.FLOAT32, 2.0)))
        edits.apply(SetValue("general.architecture", TypedValue(ValueType.STRING, "llama")))
    with GGUFFile(write(tmp_path / "t.gguf", "tokenizer.ggml.tokens", "ARRAY[INT32]")) as f:
        edits = EditList(f)
        edits.apply(SetValue("tokenizer.ggml.tokens", TypedValue(ValueType.ARRAY, [1, 2, 3], ValueType.INT32)))
        assert any("keeps its type ARRAY[INT32]" in w for w in edits.state.warnings)
        edits.apply(SetValue("tokenizer.ggml.tokens", TypedValue(ValueType.ARRAY, ["a"], ValueType.STRING)))


@pytest.mark.parametrize("wrong", list(WRONG))
@pytest.mark.parametrize("key", list(RIGHT))
def test_every_verb_survives_a_wrong_type(tmp_path, capsys, key, wrong):
    if wrong == RIGHT[key]:
        pytest.skip("the right type")
    src = write(tmp_path / "in.gguf", key, wrong)
    out = tmp_path / "o.gguf"
    rc, text, err = run(capsys, "inspect", src)
    clean(rc, err)
    rc, text, err = run(capsys, "inspect", "--json", src)
    clean(rc, err)
    s = json.loads(text)
    assert s["name"] is None or isinstance(s["name"], str)
    clean(*run(capsys, "diff", src, src)[::2])
    clean(*run(capsys, "tokenize", src, "hello")[::2])
    for edit in (["--set", f"{key}=5"], ["--set", f"{key}=llama"], ["--set", f"{key}=[1]"], ["--delete", key],
                 ["--set-typed", f"{key}=STRING:x"], ["--set", "general.architecture=qwen2"],
                 ["--set", "llama.context_length=9"], ["--special-token", "eos=1"], ["--special-token", "eos=a"],
                 ["--set", "tokenizer.ggml.eos_token_id=1"], ["--set", 'tokenizer.ggml.tokens=["x"]']):
        rc, _, err = run(capsys, "edit", src, "-o", out, "--force", *edit)
        clean(rc, err)
        if rc == 2 and key in err:
            assert any(t in err for t in WRONG) or "no key" in err or "cannot be deleted" in err, err
    with GGUFFile(src) as f:
        assert any(c.name == key and c.ok is False for c in metadata_checks(f)), "the check names the key"
