"""The chat session: history, the context policy, slash commands, save/load. No rendering here.

``ChatSession.send(text)`` yields ``Piece``s (the engine's ``Chunk``s, split by the template family's
``dialects.ReplyParser``: ``text`` is answer, ``thinking`` is thinking) and records the turn in the history
(also a partial one, when the caller stops early: Ctrl-C keeps what was shown), its thinking with it (so
``/save`` keeps it); what the next prompt shows of earlier thinking follows the template
(``dialects.history.messages_for_template``: DeepSeek-R1, QwQ and Qwen3 drop it). Thinking is controlled
by ``think`` / ``reasoning_budget`` (``chat.thinking``); ``end_thinking()`` makes the model answer now.

Before each turn the prompt is measured in tokens; if it does not fit ``n_ctx`` minus the room reserved
for the answer, the context policy decides:

* ``stop`` — refuse the turn (ContextOverflowError); the history is untouched;
* ``truncate-oldest`` (default) — drop the oldest user/assistant turns, keeping the system prompt;
* ``rolling`` — drop the oldest messages one at a time and, if one message alone is too long, keep only
  its most recent part (a rolling window over the conversation);
* ``compact`` (the default in agent mode) — past 0.8 of the window the older turns are replaced by a
  summary the model writes (``agent.compact``: a fork of the cached conversation; the last user turns
  kept whole; ``/undo-compact`` restores the history as it was, and the KV snapshot taken before the
  compaction with it); what still does not fit is dropped as with ``truncate-oldest``.

What was dropped is reported in ``ChatSession.notices`` so the UI can show it.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from contextlib import closing
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, ClassVar, Iterator

from localrun.backends.base import Chunk, Message, SamplingParams, Stats
from localrun.backends.images import IMAGE_MARKER
from localrun.chat.thinking import ThinkingMeter, Thought, turn_setup
from localrun.dialects import Delta, Family, ReplyParser, detect_family
from localrun.dialects.history import messages_for_template
from localrun.errors import ConfigError, ContextOverflowError

CONTEXT_POLICIES = ("stop", "truncate-oldest", "rolling", "compact")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass
class ChatMessage(Message):
    """A history message with the turn's ``thinking`` (assistant turns of thinking models; saved by /save
    under ``"thinking"``, which ``dialects.history`` reads)."""

    thinking: str | None = None
    tool_call_id: str | None = None  # a ``tool`` message: the call it answers

    def to_dict(self) -> dict:
        d = super().to_dict()
        if self.thinking:
            d["thinking"] = self.thinking
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


@dataclass
class Piece(Chunk):
    """One engine step of a chat turn: ``text`` is its answer text, ``thinking`` its thinking text (either
    may be "" while the parser holds back what could be a marker); the other fields are the engine's."""

    thinking: str = ""


def check_context_policy(policy: str) -> str:
    """``policy`` when it is one of CONTEXT_POLICIES; else ConfigError saying which are (`chat` checks
    ``--context-policy`` with it before it loads the model)."""
    if policy not in CONTEXT_POLICIES:
        raise ConfigError(f"unknown context policy {policy!r}", hint=f"use one of: {', '.join(CONTEXT_POLICIES)}")
    return policy


@dataclass
class ChatSession:
    message_class: ClassVar[type] = ChatMessage  # what the history holds (agent.loop makes its turns with it)
    engine: object
    params: SamplingParams
    system: str | None = DEFAULT_SYSTEM_PROMPT
    context_policy: str = "truncate-oldest"
    messages: list[Message] = field(default_factory=list)  # user/assistant turns, no system
    last_stats: Stats | None = None
    notices: list[str] = field(default_factory=list)
    turns: int = 0
    think: bool | None = None  # /think on|off, --think/--no-think; None: the template's default (on)
    reasoning_budget: int | None = None  # tokens of thinking per turn (/think budget N); None: no budget
    thought: Thought | None = None  # the thinking of the current / last turn (None: it did not think)
    kv_restored_tokens: int = 0  # tokens of KV the last load() restored (the saved ``FILE.kv``)
    # called with what the context policy dropped, before the answer starts (None: it joins ``notices``)
    on_notice: Callable[[str], None] | None = None
    images: list = field(default_factory=list)  # backends.images.ImageInput for the next message (/image PATH)
    compacted: list = field(default_factory=list)  # agent.compact.Undo of each compaction, the last one last
    last_compaction: object = None  # agent.compact.Compaction of the last compaction
    kv_snapshots: object = None  # backends.kv_cache.KVCache of compaction's KV snapshots (without engine tiers)
    undo_kv_tokens: int = 0  # tokens of KV the last undo_compact() brought back (agent.compact.restore_kv)

    def __post_init__(self) -> None:
        check_context_policy(self.context_policy)

    # ------------------------------------------------------------------ conversation
    def _system_messages(self) -> list[Message]:
        return [Message("system", self.system)] if self.system else []

    def conversation(self) -> list[Message]:
        return self._system_messages() + self.messages

    @cached_property
    def family(self) -> Family:
        """The chat template's family (``dialects.detect_family``): how the model thinks."""
        return detect_family(getattr(self.engine, "template_source", None))

    def _template_kwargs(self) -> dict:
        return turn_setup(self.family, self.params, think=self.think, budget=None).kwargs

    def render(self, messages: list[Message], kwargs: dict | None = None) -> list[int]:
        """The prompt tokens of ``messages`` as the template shows them: earlier turns' thinking kept or
        dropped (``dialects.history``), ``kwargs`` (default: this session's /think setting) passed to it.
        Raises ChatTemplateError."""
        msgs = messages_for_template([m.to_dict() | ({"images": m.images} if m.images else {}) for m in messages],
                                     self.family)
        kw = self._template_kwargs() if kwargs is None else kwargs
        return self.engine.tokenize_chat(msgs, template_kwargs=kw or None)[1]

    def prompt_tokens(self, messages: list[Message]) -> int:
        return len(self.render(messages))

    @property
    def reserve_tokens(self) -> int:
        """Room kept free for the answer: max_tokens, capped at a quarter of the context."""
        n_ctx = self.engine.n_ctx
        want = self.params.max_tokens or 512
        return max(16, min(want, n_ctx // 4))

    def _fit(self, pending: list[Message]) -> list[Message]:
        """Apply the context policy to ``pending`` (the history plus the new user message)."""
        budget = self.engine.n_ctx - self.reserve_tokens
        sys_msgs = self._system_messages()
        n = self.prompt_tokens(sys_msgs + pending)
        if self.context_policy == "compact" and n > self.compact_at * self.engine.n_ctx:
            self.compact(pending[len(self.messages):])
            pending = self.messages + pending[-1:]
            n = self.prompt_tokens(sys_msgs + pending)
        if n <= budget:
            return pending
        if self.context_policy == "stop":
            raise ContextOverflowError(n, self.engine.n_ctx,
                                       hint="/clear the history, raise --ctx, or use --context-policy truncate-oldest")
        dropped = 0
        msgs = list(pending)
        if self.context_policy in ("truncate-oldest", "compact"):
            while len(msgs) > 1 and n > budget:
                # drop the oldest turn: a user message and the answer that follows it
                k = 2 if len(msgs) > 2 and msgs[1].role == "assistant" else 1
                del msgs[:k]
                dropped += k
                n = self.prompt_tokens(sys_msgs + msgs)
        else:  # rolling
            while len(msgs) > 1 and n > budget:
                del msgs[0]
                dropped += 1
                n = self.prompt_tokens(sys_msgs + msgs)
            if n > budget:  # one message alone is too long: keep its most recent tokens
                m = msgs[0]
                toks = self.engine.tokenize(m.content, add_special=False)
                over = n - budget
                msgs[0] = Message(m.role, self.engine.detokenize(toks[over + 8:]))
                n = self.prompt_tokens(sys_msgs + msgs)
                self._notice(f"context full: dropped the first {over + 8} of the {len(toks)} tokens of your "
                             f"message (policy {self.context_policy}); the answer sees only its last "
                             f"{len(toks) - over - 8}")
        if n > budget:
            raise ContextOverflowError(n, self.engine.n_ctx,
                                       hint="this message alone is longer than the context; raise --ctx or shorten it")
        if dropped:
            self._notice(
                f"context full: dropped the {dropped} oldest message(s) to fit {self.engine.n_ctx} tokens "
                f"(policy {self.context_policy}; the system prompt is kept)"
            )
        return msgs

    compact_at = 0.8  # the ``compact`` policy's threshold, a fraction of n_ctx (agent.compact.COMPACT_AT)

    def compact(self, extra: list | None = None, stepper=None):
        """Compact the history now (``agent.compact.compact``; ``extra``: messages about to join it, kept) →
        the Compaction, or None when there was nothing older to summarize; its line goes to the notices."""
        from localrun.agent.compact import compact
        from localrun.agent.step import Stepper

        done = compact(self, stepper or Stepper(self, None), extra or [])
        if done is not None:
            self.last_compaction = done
            self._notice(done.line())
        return done

    def undo_compact(self) -> int:
        """Restore the history as it was before the last compaction, the turns since kept after it, and its KV
        snapshot (``agent.compact.undo``; ``undo_kv_tokens``: the tokens of KV that came back) → its message
        count. Raises ConfigError when nothing was compacted."""
        if not self.compacted:
            raise ConfigError("nothing to undo: the conversation has not been compacted",
                              hint="compaction happens with --context-policy compact (the default with tools)")
        from localrun.agent.compact import undo

        return undo(self)

    def _notice(self, text: str) -> None:
        """What the context policy dropped: said at once (``on_notice``, before the answer), else kept."""
        if self.on_notice is not None:
            self.on_notice(text)
        else:
            self.notices.append(text)

    def send(self, text: str) -> Iterator[Piece]:
        """Add a user message and stream the answer as ``Piece``s. The turn (even a partial one) joins the
        history with its thinking; ``thought`` follows the thinking block live.

        Raises ContextOverflowError (policy ``stop``, or a single over-long message) before anything
        changes; ChatTemplateError when the model has no chat template.
        """
        self.notices.clear()
        user = ChatMessage("user", IMAGE_MARKER * len(self.images) + text, images=self.images or None)
        self.images = []
        pending = self._fit(self.messages + [user])
        setup = self.setup()
        tokens = self.render(self._system_messages() + pending, setup.kwargs)
        parser = ReplyParser(self.family, thinking=setup.thinking, tools=False)
        answer: list[str] = []
        thinking: list[str] = []
        try:
            with closing(self.stream_reply(tokens, setup, parser)) as stream:  # closed now on Ctrl-C
                for piece in stream:
                    answer.append(piece.text)
                    thinking.append(piece.thinking)
                    yield piece
        finally:
            # keep the turn even when interrupted (Ctrl-C): the user saw this text
            self.messages = pending + [ChatMessage("assistant", "".join(answer),
                                                   thinking="".join(thinking).strip() or None)]
            self.turns += 1

    def setup(self, *, constrained: bool = False):
        """This turn's template kwargs, sampling parameters and whether it thinks (``chat.thinking.turn_setup``)
        with a fresh ``end_thinking`` event. ``constrained``: the whole answer is held to a grammar from its
        first token (a tool call), so a template with a thinking switch has thinking off."""
        self._end = threading.Event()
        t = self.family.thinking
        think = False if constrained and t is not None and t.toggle_kwarg else self.think
        return turn_setup(self.family, self.params, think=think, budget=self.reasoning_budget, end_thinking=self._end)

    def stream_reply(self, tokens: list[int], setup, parser: ReplyParser,
                     events: list | None = None) -> Iterator[Piece]:
        """Generate from ``tokens`` with ``setup`` (``setup()``), split by ``parser``: yields ``Piece``s
        (answer and thinking text), meters the thinking (``thought``), sets ``last_stats`` and the finish
        notices, says "interrupted" when closed early. The parser's other events (tool calls) are appended
        to ``events``. Records nothing in the history (the caller does)."""
        self._meter = meter = ThinkingMeter(self.family, setup.thinking)
        self.thought = meter.thought if setup.thinking else None
        finished = False
        try:
            with closing(self.engine.generate(tokens, setup.params)) as gen:  # closing it stops the decoding
                finished = yield from self._pieces(gen, parser, meter, events, setup.params)
        finally:
            if self.thought is not None and not meter.seen:
                self.thought = None  # the model answered without thinking
            if not finished:
                self.notices.append("interrupted: the partial answer is kept in the history")

    def _pieces(self, gen, parser: ReplyParser, meter: ThinkingMeter, events: list | None,
                params: SamplingParams | None = None):
        """``stream_reply``'s loop: the engine's chunks → Pieces; returns whether the last one finished.
        ``params``: the turn's sampling parameters (its constraint: a tool call's), for the finish notices."""
        started = finished = False
        for chunk in gen:
            evs = parser.feed(chunk.text) if chunk.text else []
            if chunk.finish_reason:
                evs += parser.finish()
            ans = "".join(e.text for e in evs if isinstance(e, Delta) and e.channel == "content")
            if not started:
                ans = ans.lstrip()  # the newlines a template's empty thinking block leaves (thinking off)
                started = bool(ans)
            th = "".join(e.text for e in evs if isinstance(e, Delta) and e.channel == "thinking")
            if events is not None:
                events.extend(e for e in evs if not isinstance(e, Delta))
            meter.add(chunk.text, chunk.token_id is not None, bool(ans.strip()) or any(
                not isinstance(e, Delta) for e in evs))
            if chunk.finish_reason:
                self.last_stats = chunk.stats
                finished = True
                self._note_finish(chunk, params)
            yield Piece(ans, chunk.token_id, chunk.finish_reason, chunk.stats, chunk.logprobs, thinking=th)
        return finished

    @property
    def thinking_open(self) -> bool:
        """The current turn's thinking block is open."""
        meter = getattr(self, "_meter", None)
        return meter is not None and meter.open

    @property
    def thinking_now(self) -> bool:
        """The current turn's thinking block is open and not already told to end."""
        end = getattr(self, "_end", None)
        return self.thinking_open and end is not None and not end.is_set()

    def end_thinking(self) -> bool:
        """End the current turn's thinking now: the engine writes the close at its next token and the model
        answers (``SamplingParams.end_thinking``). False when no thinking block is open (nothing done)."""
        if not self.thinking_now:
            return False
        self._end.set()
        self.thought.ended_early = True
        return True

    def complete(self, text: str) -> Iterator[Chunk]:
        """Raw completion of ``text`` (``--raw``: no template, no history), with the same notices."""
        self.notices.clear()
        for chunk in self.engine.generate(text, self.params):
            if chunk.finish_reason:
                self.last_stats = chunk.stats
                self._note_finish(chunk)
            yield chunk

    def _note_finish(self, chunk: Chunk, params: SamplingParams | None = None) -> None:
        """Say why an answer ended when the reason is not the model's own end of turn. ``params``: the turn's
        (an agent step's carries its tool-call constraint), default the session's."""
        st = chunk.stats
        if chunk.finish_reason == "length" and st and st.n_ctx_used + 1 >= st.n_ctx:
            self.notices.append("the answer stopped because the context window is full")
        elif chunk.finish_reason == "loop":
            self.notices.append(
                "stopped: the answer was repeating itself in a loop (--no-stop-loops lets it run; "
                "a higher --temp or --dry-multiplier helps a small model out of loops)"
            )
        c = (params or self.params).constraint
        raise_n = " (raise --max-tokens)" if chunk.finish_reason == "length" else ""
        if c is not None and chunk.finish_reason in ("length", "loop") and c.param == "tool_choice":
            self.notices.append("the reply was cut before the tool call (or the answer) it was writing ended: "
                                f"nothing was run{raise_n}")
        elif c is not None and chunk.finish_reason in ("length", "loop"):
            self.notices.append(f"the answer is incomplete: it was cut before it matched {c.param or 'the constraint'}"
                                + raise_n)

    # ------------------------------------------------------------------ commands
    def attach_image(self, path: str | os.PathLike) -> int:
        """/image PATH, --image PATH: the image goes with the next message (before its text) → how many are
        attached. Raises ConfigError (unreadable file), ImageInputError (the model has no projector)."""
        from localrun.backends.images import ImageInput, no_projector_error

        if getattr(self.engine, "projector", None) is None:
            raise no_projector_error(str(path))
        p = Path(path).expanduser()
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read the image {p}: {e.strerror or e}",
                              hint="give an image file's path") from None
        self.images.append(ImageInput(data, str(p)))
        return len(self.images)

    def clear(self) -> None:
        self.messages.clear()
        self.last_stats = None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the conversation as JSON, atomically (a temp file renamed into place)."""
        p = Path(path).expanduser()
        if not p.parent.is_dir():
            raise ConfigError(
                f"cannot save to {p}: the folder {p.parent} does not exist",
                hint="create it first, or give another path",
            )
        data = {
            "format": "localrun-chat/1",
            "model": self.engine.model_path,
            "system": self.system,
            "messages": [m.to_dict() | {"content": (m.content or "").replace(IMAGE_MARKER, "[image]")}
                         for m in self.messages],  # images are not saved: their place is
        }
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
        os.replace(tmp, p)
        self._save_kv(kv_path(p))
        return p

    def _save_kv(self, path: Path) -> None:
        """The conversation's KV (llama.cpp's slot 0, what chat runs on; MLX's prompt cache) next to the
        messages, so /load and --resume continue without prefilling it (``backends/kv_cache.py``,
        ``backends/mlx/cache.py``)."""
        backend = getattr(self.engine, "backend", None)
        if backend not in ("llamacpp", "mlx"):  # a test's stand-in has none
            return
        from localrun.backends import save_kv_file

        try:
            wrote = save_kv_file(self.engine, path)
            if not wrote:
                path.unlink(missing_ok=True)  # no KV now: an older snapshot must not outlive its messages
        except OSError as e:
            self.notices.append(f"the KV cache was not saved ({e}); /load will prefill the conversation")

    def _load_kv(self, path: Path) -> int:
        """Restore the KV saved next to the messages → tokens restored (0: none, or not usable: said in
        ``notices``; the next turn then prefills the conversation)."""
        backend = getattr(self.engine, "backend", None)
        if backend not in ("llamacpp", "mlx") or not path.is_file():
            return 0
        from localrun.backends import load_kv_file
        from localrun.backends.kv_files import SnapshotFileError

        try:
            return load_kv_file(self.engine, path)
        except (SnapshotFileError, OSError) as e:
            self.notices.append(f"ignored the saved KV cache {path.name} ({e}); the next turn prefills the "
                                "conversation")
            return 0

    def load(self, path: str | os.PathLike) -> int:
        """Replace the conversation with one saved by ``save`` (or a plain list of messages).

        Raises ConfigError for a missing or malformed file; the current history is kept then.
        """
        p = Path(path).expanduser()
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no such file: {p}", hint="/save FILE writes one") from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"{p} is not a saved chat ({e})") from None
        raw = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(raw, list):
            raise ConfigError(f"{p} has no 'messages' list")
        msgs, system = [], data.get("system", self.system) if isinstance(data, dict) else self.system
        for m in raw:
            if (
                not isinstance(m, dict)
                or m.get("role") not in ("system", "user", "assistant", "tool")
                or not isinstance(m.get("content"), str)
            ):
                raise ConfigError(f"{p}: each message needs a role (system/user/assistant/tool) and text content")
            if m["role"] == "system":
                system = m["content"]
            else:
                thinking = next((m[k] for k in ("thinking", "reasoning_content") if isinstance(m.get(k), str)), None)
                calls = m.get("tool_calls") if isinstance(m.get("tool_calls"), list) else None
                msgs.append(ChatMessage(m["role"], m["content"], tool_calls=calls, name=m.get("name"),
                                        thinking=thinking or None, tool_call_id=m.get("tool_call_id")))
        self.messages, self.system = msgs, system
        self.kv_restored_tokens = self._load_kv(kv_path(p))
        return len(msgs)


def kv_path(path: Path) -> Path:
    """Where ``/save FILE`` keeps the conversation's KV snapshot: ``FILE.kv``, next to it."""
    return path.with_name(path.name + ".kv")
