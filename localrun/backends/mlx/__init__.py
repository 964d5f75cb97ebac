"""The MLX wing: models through ``mlx`` / ``mlx-lm`` (Apple Silicon; ``mlx[cpu]`` on Linux).

* ``engine``: ``MlxEngine``, a ``SingleStreamEngine`` (``backends/base.py``): one sequence, mlx-lm's prompt
  cache, token control, logprobs, seeded sampling; ``batch``: ``MlxBatchEngine``, the server's
  ``BatchEngine`` on it (continuous batching on mlx-lm's batched caches; ``SerialEngine`` where they cannot);
* ``load``: an MLX folder or a GGUF file → an mlx-lm model and tokenizer; ``gguf``: GGUF → MLX weights in
  memory (native quantizations, dequantized others), and which GGUFs load natively (the planner asks);
* ``sampling``: samplers and logits processors for ``SamplingParams``; ``spec``: speculative decoding's
  MLX side (verify steps, the draft model); ``cache``: the prompt cache in ``kv_cache``'s RAM/disk tiers.

What it may import: the backend-neutral modules of ``backends/`` (``base``, ``text``, ``control``,
``kv_cache``, ``spec_decode``, ``dry``, ``choice``, ``serial``, …), ``model/``, ``offload/``, ``machine/``, ``errors``
and the foundation; never ``server/``, ``chat/``, ``commands/``, ``bench/``, ``loading`` or the llama.cpp
wing. Nothing outside ``backends/`` imports this package: they use the names ``localrun.backends``
exports. Importing this package (this file) imports nothing: ``mlx`` loads when an engine needs it.
"""
