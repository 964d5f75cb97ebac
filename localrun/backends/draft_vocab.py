"""Does a draft model share the target's vocabulary? Checked on the two GGUF headers before anything loads,
for both backends' speculative decoding (``llamacpp/spec.py``, ``mlx/spec.py``), for ``loading`` (``--draft-model``)
and for the server's per-model speculation options (``server/spec_options.py``)."""

from __future__ import annotations

from localrun.errors import LocalrunError


class VocabularyMismatchError(LocalrunError):
    exit_code = 2


def check_same_vocab(target_spec, draft_spec) -> None:
    """Raise VocabularyMismatchError unless the two GGUF headers describe the same tokenizer: model kind,
    vocabulary size, BOS/EOS ids and the text of every token (``first_token_difference``). Reads the
    files' headers only, before anything is loaded."""
    t, d = target_spec, draft_spec
    why = None
    if t.metadata.get("tokenizer.ggml.model") != d.metadata.get("tokenizer.ggml.model"):
        why = "tokenizer kinds differ"
    elif t.vocab_size != d.vocab_size:
        why = f"vocabulary sizes differ ({t.vocab_size} vs {d.vocab_size} tokens)"
    elif (t.bos_token_id, t.eos_token_id) != (d.bos_token_id, d.eos_token_id):
        why = "BOS/EOS token ids differ"
    else:
        bad = first_token_difference(t, d)
        if bad is not None:
            why = f"token {bad} is {t.token_text(bad)!r} in the target but {d.token_text(bad)!r} in the draft"
    if why:
        raise VocabularyMismatchError(
            f"the draft model does not share the target's vocabulary: {why}",
            hint="use a draft model of the same family (the same tokenizer), or --spec ngram")


def first_token_difference(a, b) -> int | None:
    """The first token id whose text differs between two GGUF headers' ``tokenizer.ggml.tokens`` arrays
    (``ModelSpec``s of the same vocabulary size), None when all are equal: one sequential read of both
    arrays (GGUF string = uint64 length + bytes; ggml/docs/gguf.md), ≈ 0.3 s for a 262k vocabulary.
    ``ModelSpec.token_text`` re-skips the array from its start on every call, minutes for thousands of ids
    on such a vocabulary. Headers without the array (not read): compares the first and last 256 ids."""
    import struct

    key = "tokenizer.ggml.tokens"
    n = a.vocab_size
    if key not in a.array_offsets or key not in b.array_offsets:
        ids = list(range(min(256, n))) + list(range(max(256, n - 256), n))
        return next((i for i in ids if a.token_text(i) != b.token_text(i)), None)
    with open(a.path, "rb", buffering=1 << 20) as fa, open(b.path, "rb", buffering=1 << 20) as fb:
        fa.seek(a.array_offsets[key])
        fb.seek(b.array_offsets[key])
        for i in range(n):
            la, lb = fa.read(8), fb.read(8)
            if la != lb:
                return i
            ta, tb = fa.read(struct.unpack("<Q", la)[0]), fb.read(struct.unpack("<Q", lb)[0])
            if ta != tb:
                return i
    return None
