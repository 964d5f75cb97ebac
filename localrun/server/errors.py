"""Server-side errors and the one table that maps every ``LocalrunError`` to an HTTP status by type.

Error bodies are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``; the Ollama
endpoints answer ``{"error": "message"}`` as Ollama does.
"""

from __future__ import annotations

from localrun.errors import (
    BackendError,
    BackendUnavailableError,
    ChatTemplateError,
    ConfigError,
    ConstraintError,
    ContextOverflowError,
    ImageInputError,
    InsufficientMemoryError,
    LocalrunError,
    ModelNotFoundError,
)


class RequestError(LocalrunError):
    """The request is invalid (a 4xx). ``param`` names the field, ``code`` is OpenAI's error code."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param
        self.code = code
        self.status = status


class QueueFullError(LocalrunError):
    """Every sequence slot is busy and the wait queue is full (503 with Retry-After)."""

    def __init__(self, max_queue: int, retry_after_s: int = 1) -> None:
        super().__init__(f"the server is busy: {max_queue} request{'s are' if max_queue != 1 else ' is'} "
                         "already waiting",
                         hint="retry later, or start the server with a larger --max-queue/--parallel")
        self.retry_after_s = retry_after_s


class ShuttingDownError(LocalrunError):
    """The server received SIGINT/SIGTERM: running and queued requests end with this (503)."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down", hint="retry when it is back up")


# (status, OpenAI error type, code); the first matching class wins, so subclasses come first.
_STATUS_BY_TYPE: list[tuple[type, int, str, str | None]] = [
    (ShuttingDownError, 503, "server_error", "shutting_down"),
    (ContextOverflowError, 400, "invalid_request_error", "context_length_exceeded"),
    (ChatTemplateError, 400, "invalid_request_error", "chat_template_error"),
    (ModelNotFoundError, 404, "invalid_request_error", "model_not_found"),
    (QueueFullError, 503, "server_busy", "queue_full"),
    (InsufficientMemoryError, 503, "server_error", "insufficient_memory"),
    (BackendUnavailableError, 501, "server_error", "backend_unavailable"),
    (BackendError, 500, "server_error", "backend_error"),
    (ConfigError, 400, "invalid_request_error", "invalid_value"),
    (ConstraintError, 400, "invalid_request_error", "unsupported_schema"),
    (ImageInputError, 400, "invalid_request_error", "invalid_image"),
    (LocalrunError, 400, "invalid_request_error", None),
]


def error_info(exc: LocalrunError) -> tuple[int, dict]:
    """``exc`` → (HTTP status, OpenAI error object). The status is chosen by type, never by text."""
    if isinstance(exc, RequestError):
        status, etype, code, param = exc.status, "invalid_request_error", exc.code, exc.param
    else:
        status, etype, code, param = 500, "server_error", None, None
        for cls, st, et, cd in _STATUS_BY_TYPE:
            if isinstance(exc, cls):
                status, etype, code = st, et, cd
                break
        if isinstance(exc, (ContextOverflowError, ConstraintError, ImageInputError)):
            param = exc.param or None
    msg = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
    body = error_body(msg, etype=etype, param=param, code=code)
    if isinstance(exc, ContextOverflowError):  # as llama-server's exceed_context_size_error
        body["error"].update(n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
    return status, body


def error_body(message: str, *, etype: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}
