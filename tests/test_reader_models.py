"""Our reader agrees with gguf-py's GGUFReader on the three real models: names, shapes, types, offsets, metadata."""

from __future__ import annotations

import numpy as np
import pytest

from quantscope.core.gguf import GGUFFile, StringArray, ValueType

from .conftest import MODEL_NAMES

EXPECTED = {
    # name: (version, kv, tensors, data_start, file_type name, arch)
    "smollm2": (3, 33, 272, 1_785_664, "MOSTLY_Q4_1", "llama"),
    "gemma3": (3, 33, 236, 6_525_120, "MOSTLY_Q4_K_M", "gemma3"),
    "qwen2.5-coder": (3, 26, 291, 5_947_776, "MOSTLY_Q4_K_M", "qwen2"),
}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_header_facts(name, model_path):
    with GGUFFile(model_path(name)) as f:
        version, kv, tensors, data_start, ft, arch = EXPECTED[name]
        assert (f.version, len(f.metadata), len(f.tensors), f.data_start) == (version, kv, tensors, data_start)
        assert f.file_type_name == ft
        assert f.architecture == arch
        assert f.alignment == 32
        assert f.problems == []
        last = max(f.tensors, key=lambda t: t.offset)
        assert last.data_offset + last.n_bytes <= f.file_size


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_matches_gguf_py(name, model_path, gguf_py_reader):
    ref = gguf_py_reader(name)
    with GGUFFile(model_path(name)) as f:
        # tensors: names, ne, types, absolute offsets, byte counts, and the very same bytes
        assert [t.name for t in f.tensors] == [t.name for t in ref.tensors]
        for ours, theirs in zip(f.tensors, ref.tensors, strict=True):
            assert ours.ne == tuple(int(x) for x in theirs.shape), ours.name
            assert ours.type_id == int(theirs.tensor_type), ours.name
            assert ours.data_offset == theirs.data_offset, ours.name
            assert ours.n_bytes == theirs.n_bytes, ours.name
            assert ours.n_elements == theirs.n_elements, ours.name
        for t in f.tensors[:: max(1, len(f.tensors) // 12)]:
            theirs = next(x for x in ref.tensors if x.name == t.name)
            assert np.array_equal(f.tensor_bytes(t), np.asarray(theirs.data).reshape(-1).view(np.uint8))
        # metadata: same keys in the same order, same types and values
        ref_keys = [k for k in ref.fields if not k.startswith("GGUF.")]
        assert list(f.metadata) == ref_keys
        for key in ref_keys:
            field = ref.fields[key]
            kv = f.metadata[key]
            assert int(kv.type) == int(field.types[0]), key
            expected = field.contents()
            if kv.type == ValueType.ARRAY:
                assert int(kv.elem_type) == int(field.types[1]), key
                if isinstance(kv.value, StringArray):
                    assert kv.value.to_list() == expected, key
                else:
                    assert np.array_equal(kv.value, np.asarray(expected, dtype=kv.value.dtype)), key
            elif kv.type == ValueType.FLOAT32:
                assert np.float32(kv.value) == np.float32(expected), key
            else:
                assert kv.value == expected, key


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_numeric_arrays_are_zero_copy_views(name, model_path):
    with GGUFFile(model_path(name)) as f:
        arrays = [kv for kv in f.metadata.values()
                  if kv.type == ValueType.ARRAY and isinstance(kv.value, np.ndarray) and len(kv.value)]
        assert arrays, "every test model has numeric arrays (token types)"
        for kv in arrays:
            assert not kv.value.flags.owndata
            assert not kv.value.flags.writeable
        toks = f.get("tokenizer.ggml.tokens")
        assert isinstance(toks, StringArray)
        assert toks._index is None, "string index must not be built at open"
        assert isinstance(toks[len(toks) - 1], str)
        assert toks._index is not None
