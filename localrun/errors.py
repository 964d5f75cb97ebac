"""Every error localrun raises on purpose, in one tree.

Each carries attributes (not just text) and a ``hint``: the next thing the user should do. The CLI
turns any ``LocalrunError`` into ``error: <message>`` + ``hint`` and the exit code below; a traceback
is shown only with ``LOCALRUN_DEBUG=1``. The HTTP server maps them to 4xx/5xx by type, never by text.

    LocalrunError                      exit 1
    ├── ModelNotFoundError             exit 2   a path or name that resolves to nothing
    │   └── AmbiguousModelError        exit 2   a folder (or name) that holds several models
    ├── ModelFormatError               exit 3   not a GGUF / corrupt header
    │   └── TruncatedModelError        exit 3   header fine, tensor data cut short
    ├── UnsupportedArchitectureError   exit 3   llama.cpp cannot run this architecture
    ├── InsufficientMemoryError        exit 4   the plan does not fit this machine
    ├── ChatTemplateError              exit 5   no/invalid chat template
    ├── ContextOverflowError           exit 6   prompt longer than the context window
    ├── BackendUnavailableError        exit 7   llama_cpp / mlx not importable or lacks a feature
    ├── BackendError                   exit 8   the backend failed at run time (decode error, …)
    ├── ConfigError                    exit 9   a bad flag value, env var or config file
    │   └── SizeError                  exit 9   a size that cannot be read (--vram 24: no unit)
    ├── ConstraintError                exit 9   a schema/regex/grammar constrained decoding cannot enforce
    ├── ImageInputError                exit 9   an image that cannot be used (no projector, not decodable)
    └── DownloadError                  exit 10  pull failed (network, checksum, access, disk space)
"""

from __future__ import annotations


class LocalrunError(Exception):
    """Base class. ``message`` says what went wrong, ``hint`` what to do next."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ModelNotFoundError(LocalrunError):
    """MODEL is neither an existing file, a directory, nor a catalog name."""

    exit_code = 2

    def __init__(self, model: str, *, hint: str | None = None, message: str | None = None) -> None:
        super().__init__(
            message or f"model not found: {model!r}",
            hint=hint
            or "give a path to a .gguf file, a name from `localrun ls`/models.toml, or omit MODEL "
            "to use the embedded default (SmolLM2-135M-Instruct)",
        )
        self.model = model


class AmbiguousModelError(ModelNotFoundError):
    """MODEL is a folder holding several GGUF models; ``candidates`` are their paths."""

    def __init__(self, model: str, candidates: list[str], *, hint: str | None = None) -> None:
        shown = ", ".join(candidates[:8]) + (f", … ({len(candidates) - 8} more)" if len(candidates) > 8 else "")
        LocalrunError.__init__(self, f"{model} holds {len(candidates)} models: {shown}",
                               hint=hint or "give the path of one of them as MODEL")
        self.model = model
        self.candidates = candidates


class ModelFormatError(LocalrunError):
    """The file is not a GGUF file, or its header is corrupt."""

    exit_code = 3

    def __init__(self, path: str, reason: str, *, hint: str | None = None) -> None:
        super().__init__(
            f"{path}: not a usable GGUF file ({reason})",
            hint=hint or "check that the download completed; localrun reads GGUF v2/v3 files",
        )
        self.path = path
        self.reason = reason


class TruncatedModelError(ModelFormatError):
    """The header is valid but the tensor data is shorter than the header says."""

    def __init__(self, path: str, file_bytes: int, expected_bytes: int) -> None:
        super().__init__(
            path,
            f"weights incomplete: file has {file_bytes:,} bytes, header describes {expected_bytes:,}",
            hint="the download was cut short: pull it again. `localrun inspect` and `localrun fit` "
            "still work on the header",
        )
        self.file_bytes = file_bytes
        self.expected_bytes = expected_bytes


class UnsupportedArchitectureError(LocalrunError):
    exit_code = 3

    def __init__(self, arch: str, backend: str, *, hint: str | None = None) -> None:
        super().__init__(
            f"architecture {arch!r} is not supported by the {backend} backend",
            hint=hint or "upgrade llama-cpp-python (`pip install -U llama-cpp-python`) or try "
            "`--backend mlx`",
        )
        self.arch = arch
        self.backend = backend


class InsufficientMemoryError(LocalrunError):
    exit_code = 4

    def __init__(self, message: str, *, needed_bytes: int = 0, available_bytes: int = 0,
                 hint: str | None = None) -> None:
        super().__init__(
            message,
            hint=hint or "try a smaller quantization, a shorter context (--ctx), a quantized KV cache "
            "(--kv-type q8_0), or --force to load anyway",
        )
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes


class ChatTemplateError(LocalrunError):
    exit_code = 5


class ContextOverflowError(LocalrunError):
    """A prompt does not fit the context window (OpenAI: ``context_length_exceeded``)."""

    exit_code = 6

    def __init__(self, n_prompt_tokens: int, n_ctx: int, *, hint: str | None = None,
                 param: str = "messages") -> None:
        super().__init__(
            f"prompt is {n_prompt_tokens} tokens, the context window is {n_ctx} tokens",
            hint=hint or "shorten the prompt, clear the history (/clear), or raise --ctx",
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx
        self.param = param  # the request field that is too long (the server's error object names it)


class BackendUnavailableError(LocalrunError):
    exit_code = 7


class BackendError(LocalrunError):
    exit_code = 8


class ConfigError(LocalrunError):
    exit_code = 9


class SizeError(ConfigError, ValueError):
    """A byte size the user typed cannot be read (``--vram 24``: no unit). Also a ValueError, for callers
    that catch that around ``localrun.units.parse_bytes``."""


class ConstraintError(LocalrunError):
    """A structured-output request (JSON schema, regex, grammar) that constrained decoding cannot enforce:
    refused, never silently relaxed. ``keyword``: the unsupported JSON Schema keyword (or None),
    ``path``: its JSON Pointer inside the schema ("" = the root), ``param``: the request field or flag."""

    exit_code = 9

    def __init__(self, message: str, *, keyword: str | None = None, path: str = "", param: str = "",
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint or "remove or rewrite that part of the schema; the supported "
                         "JSON Schema subset is llguidance's (docs/json_schema.md in guidance-ai/llguidance)")
        self.keyword = keyword
        self.path = path
        self.param = param


class ImageInputError(LocalrunError):
    """An image a request or prompt sent cannot be used: the model has no vision projector, the bytes do not
    decode, it is too large, a URL that may not be fetched (HTTP 400). ``param``: the request part, e.g.
    ``messages[0].content[1]``."""

    exit_code = 9

    def __init__(self, message: str, *, param: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param


class DownloadError(LocalrunError):
    exit_code = 10
