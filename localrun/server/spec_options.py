"""``localrun serve --spec auto|ngram|draft|off --draft-model MODEL --draft-max N``: the speculative decoding a
model loads with (``loading.plan_load``'s ``spec_mode`` / ``draft_model`` / ``draft_max``).

A server holds several models and ``--draft-model`` names one: it drafts for every model that shares its
vocabulary (same tokenizer, ``backends.draft_vocab.check_same_vocab`` on the GGUF headers). A model with another
vocabulary speculates with prompt lookup instead (``auto``: adaptive, off where it would lose) and the log
says so, so loading a second model never fails over the first one's draft model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("localrun.server")


@dataclass(frozen=True)
class SpecOptions:
    """serve's speculation flags: ``mode`` auto | ngram | draft | off, ``draft_model`` (a model argument,
    resolved like MODEL), ``draft_max`` tokens per verify step at most (None: the engine's default)."""

    mode: str = "off"
    draft_model: str | None = None
    draft_max: int | None = None

    def check(self, models_dir: Path | None) -> "SpecOptions":
        """Check the flags at start-up (before any model loads) → the options with the draft model's path
        resolved. Raises ConfigError (an unknown mode; ``draft`` without ``--draft-model``),
        ModelNotFoundError (no such draft model)."""
        from localrun.backends.spec_decode import SPEC_MODES
        from localrun.errors import ConfigError

        if self.mode not in SPEC_MODES:
            raise ConfigError(f"unknown --spec {self.mode!r}", hint=f"use one of {', '.join(SPEC_MODES)}")
        if self.mode == "draft" and not self.draft_model:
            raise ConfigError("--spec draft needs --draft-model",
                              hint="give --draft-model MODEL (same vocabulary), or use --spec ngram")
        if not self.draft_model or self.mode in ("off", "ngram"):
            return SpecOptions(self.mode, None, self.draft_max)
        from localrun.store.resolve import resolve_model

        return SpecOptions(self.mode, str(resolve_model(self.draft_model, models_dir)), self.draft_max)

    def for_model(self, model_path) -> dict:
        """``plan_load`` keywords for the model at ``model_path``: the draft model when it shares the model's
        vocabulary, else prompt lookup (``auto``). Raises nothing (an unreadable header is left to the load)."""
        mode, draft = self.mode, self.draft_model
        if draft and mode in ("auto", "draft") and not _same_vocab(model_path, draft):
            log.warning("%s: the draft model %s has another vocabulary; speculating with prompt lookup",
                        Path(str(model_path)).name, Path(draft).name)
            mode, draft = "auto", None
        return {"spec_mode": mode, "draft_model": draft, "draft_max": self.draft_max}


def _same_vocab(model_path, draft_path: str) -> bool:
    from localrun.backends.draft_vocab import VocabularyMismatchError, check_same_vocab
    from localrun.model.gguf_info import read_gguf

    if not (Path(str(model_path)).is_file() and Path(draft_path).is_file()):
        return True  # an MLX folder: its engine checks its own draft
    try:
        check_same_vocab(read_gguf(str(model_path)), read_gguf(draft_path))
    except VocabularyMismatchError:
        return False
    except Exception:  # noqa: BLE001 - a header that does not read: plan_load says what is wrong
        return True
    return True
