"""GGUF header reading on the three real files, including the truncated 7B header, and bad files."""

import struct

import pytest

from localrun.errors import ModelFormatError, ModelNotFoundError, TruncatedModelError
from localrun.model.gguf_info import GGML_TYPES, read_gguf


def test_smollm2_architecture(smollm_path):
    s = read_gguf(smollm_path)
    assert (s.arch, s.n_layer, s.n_head, s.n_head_kv, s.head_dim_k, s.n_embd) == ("llama", 30, 9, 3, 64, 576)
    assert s.n_ctx_train == 8192 and s.vocab_size == 49152
    assert s.file_type == "Q4_1" and not s.truncated
    assert s.chat_template and "<|im_start|>" in s.chat_template
    assert s.token_text(s.bos_token_id) == "<|im_start|>" and s.token_text(s.eos_token_id) == "<|im_end|>"
    assert s.expected_file_bytes == s.file_bytes == smollm_path.stat().st_size
    assert s.n_params == 134_515_008
    assert sum(s.layer_bytes) + sum(t.n_bytes for t in s.tensors if t.layer is None) == s.tensor_bytes


def test_gemma3_sliding_window_and_no_template(gemma_path):
    s = read_gguf(gemma_path)
    assert (s.arch, s.n_layer, s.n_head, s.n_head_kv, s.head_dim_k, s.head_dim_v) == ("gemma3", 18, 4, 1, 256, 256)
    assert s.sliding_window == 512
    # llama.cpp's gemma3 pattern: 5 local layers then 1 global
    assert s.swa_layers == [(i % 6) < 5 for i in range(18)]
    assert s.chat_template is None
    assert s.file_type == "Q4_K_M"
    assert {"Q8_0", "Q6_K", "Q4_K", "Q5_0"} <= set(s.bytes_by_type)


def test_truncated_7b_header(deepseek_header_path):
    s = read_gguf(deepseek_header_path)
    assert (s.arch, s.n_layer, s.n_head, s.n_head_kv, s.head_dim_k, s.n_embd, s.n_ff) == \
        ("qwen2", 28, 28, 4, 128, 3584, 18944)
    assert s.n_ctx_train == 131072
    assert 7.6e9 < s.n_params < 7.7e9
    assert s.truncated and s.file_bytes < s.expected_file_bytes
    with pytest.raises(TruncatedModelError) as e:
        s.check_complete()
    assert "incomplete" in str(e.value) and e.value.expected_bytes == s.expected_file_bytes


def test_type_table_matches_gguf_package():
    from gguf import GGML_QUANT_SIZES

    for qt, (block, size) in GGML_QUANT_SIZES.items():
        if int(qt) in GGML_TYPES:
            name, b, n = GGML_TYPES[int(qt)]
            assert (name, b, n) == (qt.name, block, size)


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError):
        read_gguf(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, this is not a model")
    with pytest.raises(ModelFormatError, match="bad magic"):
        read_gguf(p)


def test_empty_and_corrupt_header(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(ModelFormatError):
        read_gguf(p)
    q = tmp_path / "corrupt.gguf"
    q.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 10, 2) + b"\x05\x00")  # header cut inside a key
    with pytest.raises(ModelFormatError, match="header"):
        read_gguf(q)
    v = tmp_path / "v9.gguf"
    v.write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    with pytest.raises(ModelFormatError, match="version"):
        read_gguf(v)


def test_one_parser_reads_the_vocabulary_for_mlx(smollm_path):
    """gguf_info is the only GGUF metadata parser: with ``all_arrays`` it returns the vocabulary the MLX
    backend builds its tokenizer from, equal to the gguf package's reader."""
    import gguf

    from localrun.backends.mlx.gguf import read_metadata

    md = read_metadata(str(smollm_path))
    ref = gguf.GGUFReader(str(smollm_path))
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        f = ref.fields[key]
        assert md[key] == [bytes(f.parts[i]).decode() for i in f.data], key
    f = ref.fields["tokenizer.ggml.token_type"]
    assert md["tokenizer.ggml.token_type"] == [int(f.parts[i][0]) for i in f.data]
    assert read_gguf(smollm_path).metadata["tokenizer.ggml.tokens"] is None  # counted only, by default
