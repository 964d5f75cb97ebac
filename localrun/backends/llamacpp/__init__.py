"""The llama.cpp wing: GGUF models through llama-cpp-python's C API (``llama_cpp.llama_cpp``).

* ``engine``: ``LlamaCppEngine``, the ``BatchEngine`` (``backends/base.py``): load, tokenize, chat template,
  sampler chains, and which slot a prompt takes and how much of its cached KV it reuses (``start``);
  ``batch``: its ``step`` (a mixin): one ``llama_decode`` of prefill chunks or decode tokens, then sampling
  (token control, logprobs, speculative verify rows);
* ``seq``: ``Slot`` and ``Generation``; ``sampling``: llama.cpp's sampler chain for ``SamplingParams``;
* ``params``: the one place that loads a model or creates a context (placement, load mode, threads);
  ``lib``: the library itself (import, log capture, CPU/GPU facts, buffer-type overrides);
* ``spec``: speculative decoding's llama.cpp side (``Speculation``, ``DraftModel``);
* ``embed``: sentence embeddings on a second context; ``dryrun``: llama.cpp's own compute-buffer sizes for
  a plan (``fit``); ``rpc``: RPC workers as devices (``--rpc``).

What it may import: the backend-neutral modules of ``backends/`` (``base``, ``text``, ``control``,
``kv_cache``, ``spec_decode``, ``dry``, …), ``model/``, ``offload/``, ``machine/``, ``errors`` and the
foundation; never ``server/``, ``chat/``, ``commands/``, ``bench/``, ``loading`` or the MLX wing. Nothing
outside ``backends/`` imports this package: they use the names ``localrun.backends`` exports. Importing
this package (this file) imports nothing: ``llama_cpp`` loads when an engine (or ``lib.import_llama``) needs it.
"""
