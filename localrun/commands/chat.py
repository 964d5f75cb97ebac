"""`localrun chat [MODEL]`: terminal chat that streams, remembers, shows TTFT and tok/s, and survives
bad input and Ctrl-C. Piped stdin (`echo hi | localrun chat`) or --prompt: one answer, text only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer


def threads_option(value: Optional[str]) -> Optional[int]:
    """``-t/--threads`` as in llama.cpp: a CPU thread count ≥ 1. ``chat -t 0`` / ``-t 0.7`` (the temperature, in
    localrun's first releases) is refused with a pointer to ``--temp`` instead of running with 0 threads."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise typer.BadParameter(f"{value!r} is not a thread count: -t/--threads sets CPU threads, as in "
                                 f"llama.cpp. For the sampling temperature use --temp {value}")
    return n


def register(app: typer.Typer) -> None:
    @app.command("chat")
    def chat(
        model: Optional[str] = typer.Argument(None,
            help="A .gguf path or model name (default: the embedded SmolLM2-135M-Instruct)."),
        prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="Answer one prompt and exit."),
        system: Optional[str] = typer.Option(None, "--system",
            help="System prompt (default: 'You are a helpful assistant.'; '' for the model's own)."),
        temperature: float = typer.Option(0.8, "--temp", "--temperature", min=0.0, help="0 = greedy."),
        top_p: float = typer.Option(0.95, "--top-p", min=0.0, max=1.0),
        top_k: int = typer.Option(40, "--top-k", min=0),
        min_p: float = typer.Option(0.05, "--min-p", min=0.0, max=1.0),
        repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", min=0.0,
            help="Penalty on tokens among the last --repeat-last-n (1 = off)."),
        repeat_last_n: int = typer.Option(64, "--repeat-last-n", min=-1,
            help="Window of --repeat-penalty, tokens (-1 = the context)."),
        dry_multiplier: float = typer.Option(0.8, "--dry-multiplier", min=0.0,
            help="DRY repetition penalty (0 = off; on by default in chat: it keeps small models out of loops)."),
        stop_loops: bool = typer.Option(True, "--stop-loops/--no-stop-loops",
            help="End an answer that repeats itself in a cycle (on by default in chat)."),
        seed: Optional[int] = typer.Option(None, "--seed", "-s"),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", "--n-predict", "-n", min=1,
            help="Cap on answer length, tokens."),
        ctx: Optional[int] = typer.Option(None, "--ctx", "--ctx-size", "-c", min=16,
            help="Context window, tokens (default: the plan's)."),
        threads: Optional[str] = typer.Option(None, "--threads", "-t", callback=threads_option, metavar="N",
            help="CPU threads (default: the plan's, physical cores). Temperature is --temp."),
        n_gpu_layers: Optional[int] = typer.Option(None, "--n-gpu-layers", "-ngl",
            help="Layers on the GPU (default: the plan's; -1 = all)."),
        kv_type: Optional[str] = typer.Option(None, "--kv-type", help="KV-cache type: f16, q8_0, q4_0."),
        flash_attn: Optional[bool] = typer.Option(None, "--flash-attn/--no-flash-attn", "-fa",
            help="Flash attention (default: the plan's: on with a GPU, off on the CPU)."),
        backend: Optional[str] = typer.Option(None, "--backend",
            help="llamacpp or mlx (default: the planner's choice)."),
        raw: bool = typer.Option(False, "--raw", help="Plain text completion, no chat template (for base models)."),
        chat_template: Optional[str] = typer.Option(None, "--chat-template",
            help="chatml, llama3, gemma, mistral, phi3, or a Jinja file."),
        context_policy: Optional[str] = typer.Option(None, "--context-policy",
            help="When the context is full: stop, truncate-oldest, rolling, compact (a summary the model "
                 "writes; /undo-compact). Default: compact with tools, else truncate-oldest."),
        force: bool = typer.Option(False, "--force", help="Load even if the plan says it does not fit."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the plan and stats in one-shot mode."),
        json_schema: Optional[Path] = typer.Option(None, "--json-schema", metavar="FILE",
            help="The answer is JSON matching this JSON Schema file (constrained decoding)."),
        regex: Optional[str] = typer.Option(None, "--regex",
            help="The answer matches this regex in full (constrained decoding)."),
        think: Optional[bool] = typer.Option(None, "--think/--no-think",
            help="Thinking models: think before answering, or not (default: the template's; /think in chat)."),
        reasoning_budget: Optional[int] = typer.Option(None, "--reasoning-budget", min=0, metavar="N",
            help="Thinking models: at most N tokens of thinking, then the model answers (0: at once)."),
        spec_mode: Optional[str] = typer.Option(None, "--spec", metavar="auto|ngram|draft|off",
                                      help="Speculative decoding (llama.cpp): prompt lookup or a draft model, on "
                                           "while it measures a speed-up. Off by default (auto with --draft-model): "
                                           "not lossless on the CPU (a verify step takes other kernels than a "
                                           "one-token step: logprobs move by up to ~0.3 nat and greedy or "
                                           "seeded text can change where the top-2 margin is below ~0.3; "
                                           "docs/chat.md, Not exact)."),
        draft_model: Optional[str] = typer.Option(None, "--draft-model", metavar="MODEL",
                                                  help="A small model with the same vocabulary (--spec)."),
        draft_max: Optional[int] = typer.Option(None, "--draft-max", min=0, metavar="N",
                                                help="Drafted tokens per verify step at most (default 16)."),
        resume: Optional[Path] = typer.Option(None, "--resume", metavar="FILE",
            help="Continue the conversation saved in FILE (/save FILE: messages and KV cache, so no prefill) "
                 "and save it back there on exit; a FILE not there yet starts it."),
        hide_thinking: bool = typer.Option(False, "--hide-thinking",
            help="Do not show the thinking (only how long it took); -p never writes it to stdout."),
        mmproj: Optional[Path] = typer.Option(None, "--mmproj", metavar="FILE",
            help="Vision projector GGUF (images in; default: an mmproj-*.gguf beside the model)."),
        no_mmproj_offload: bool = typer.Option(False, "--no-mmproj-offload",
            help="Keep the vision projector on the CPU."),
        image: List[Path] = typer.Option([], "--image", metavar="PATH",
            help="An image sent with the -p prompt (repeatable; /image PATH in chat)."),
        tools: Optional[str] = typer.Option(None, "--tools", metavar="read,write,shell",
            help="Agent mode: built-in tools the model may call (read files; write/edit files; run shell "
                 "commands). Off unless given; writes and commands ask first (/tools in chat)."),
        mcp: Optional[Path] = typer.Option(None, "--mcp", metavar="CONFIG",
            help="Agent mode: MCP servers from an mcpServers JSON file (the Claude Desktop / Cursor / LM Studio "
                 "format), stdio or streamable HTTP; their tools are offered to the model (/mcp in chat)."),
        auto_approve: bool = typer.Option(False, "--auto-approve",
            help="Agent mode: allow every tool call without asking (for scripts; `run --yes` is the download's)."),
        max_steps: int = typer.Option(10, "--max-steps", min=1,
            help="Agent mode: model steps (tool call rounds) per message at most."),
        tool_choice: str = typer.Option("auto", "--tool-choice", metavar="auto|required|NAME",
            help="Agent mode: the first step of each message must call a tool (required) or the tool NAME "
                 "(constrained decoding)."),
        rpc: Optional[str] = typer.Option(None, "--rpc", metavar="HOST:PORT,…",
            help="RPC workers (`localrun worker`) to split the model over, planned per device. llama.cpp ends "
                 "this process if a worker goes away mid-answer (serve --rpc survives it)."),
    ) -> None:
        """Chat with a model in the terminal."""
        from localrun.backends.base import SamplingParams
        from localrun.chat import DEFAULT_SYSTEM_PROMPT, ChatSession, Repl
        from localrun.chat.session import check_context_policy
        from localrun.loading import load_model
        from localrun.render import stderr

        agent_mode = bool(tools or mcp)
        if context_policy is None:
            context_policy = "compact" if agent_mode else "truncate-oldest"
        check_context_policy(context_policy)  # a mistyped flag is said before a model loads (seconds to minutes)
        err = stderr()
        interactive = prompt is None and sys.stdin.isatty()
        tool_sets = _tool_sets(tools, raw, json_schema, regex)
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                                max_tokens=max_tokens, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                dry_multiplier=dry_multiplier, stop_loops=stop_loops,
                                constraint=_constraint(json_schema, regex))
        # DRY and the loop guard apply under a constraint too: DRY steers among the tokens the grammar allows,
        # and a loop cut says the structured answer is incomplete (docs/architecture.md §2)
        from localrun.backends import hardware_for

        hardware = hardware_for(rpc)
        from localrun.backends.spec_decode import spec_mode_or_default

        spec_mode = spec_mode_or_default(spec_mode, draft_model)

        def check(prep) -> None:  # a base model is refused before its weights load
            if not raw and prep.has_chat_template is False:
                raise _no_chat_template(prep.path)

        if interactive:
            with err.status("loading model…", spinner="dots") as st:
                loaded = load_model(model, backend=backend, n_ctx=ctx, n_gpu_layers=n_gpu_layers,
                                    n_threads=threads, kv_type=kv_type, flash_attn=flash_attn,
                                    chat_template=chat_template, force=force,
                                    status=lambda t: st.update(t), spec_mode=spec_mode,
                                    draft_model=draft_model, draft_max=draft_max, hardware=hardware,
                                    mmproj=str(mmproj) if mmproj else None, no_mmproj_offload=no_mmproj_offload,
                                    check=check)
        else:
            loaded = load_model(model, backend=backend, n_ctx=ctx, n_gpu_layers=n_gpu_layers, n_threads=threads,
                                kv_type=kv_type, flash_attn=flash_attn, chat_template=chat_template, force=force,
                                spec_mode=spec_mode, draft_model=draft_model, draft_max=draft_max,
                                hardware=hardware, mmproj=str(mmproj) if mmproj else None,
                                no_mmproj_offload=no_mmproj_offload, check=check)
        engine = loaded.engine
        try:
            if not raw and not engine.has_chat_template:  # an MLX folder (no GGUF header to read before)
                raise _no_chat_template(engine.model_path)
            sys_prompt = DEFAULT_SYSTEM_PROMPT if system is None else (system or None)
            session = ChatSession(engine, params, system=sys_prompt, context_policy=context_policy,
                                  think=think, reasoning_budget=reasoning_budget)
            if resume is not None:
                _resume(session, resume, raw, err)
            for path in image:
                session.attach_image(path)
            agent, configs = None, []
            if not raw and (agent_mode or interactive):
                from localrun.chat.agent_view import build_agent

                agent, configs = build_agent(session, tool_sets, mcp, yes=auto_approve, max_steps=max_steps,
                                             tool_choice=tool_choice, err=err)
            try:
                if not interactive:
                    text = prompt if prompt is not None else sys.stdin.read()
                    if agent is not None and agent.toolbox:
                        from localrun.chat.agent_view import one_shot

                        one_shot(session, agent, text.strip(), hide_thinking=hide_thinking)
                    else:
                        _one_shot(session, text, raw, verbose, loaded, hide_thinking=hide_thinking)
                    return
                Repl(session, loaded, raw=raw, hide_thinking=hide_thinking, agent=agent, mcp_config=configs).run()
            finally:
                if agent is not None:
                    agent.toolbox.close()
                if resume is not None and session.messages:
                    session.save(resume)  # messages and the KV cache (FILE.kv)
                    err.print(f"saved the conversation to {resume}", style="dim")
        finally:
            engine.close()


def _tool_sets(tools: Optional[str], raw: bool, json_schema, regex) -> list[str]:
    """--tools read,write,shell → the set names, checked before the model loads. Raises ConfigError."""
    from localrun.agent.tools import BUILTIN_SETS
    from localrun.errors import ConfigError

    sets = [x.strip() for x in (tools or "").replace(" ", ",").split(",") if x.strip()]
    bad = [x for x in sets if x not in BUILTIN_SETS]
    if bad:
        raise ConfigError(f"--tools {tools}: unknown tool set {bad[0]!r}", hint=f"use {','.join(BUILTIN_SETS)}")
    if sets and raw:
        raise ConfigError("--tools needs the chat template; --raw completions cannot call tools", hint="drop --raw")
    if sets and (json_schema or regex):
        raise ConfigError("--tools and --json-schema/--regex both constrain the answer",
                          hint="give one of them")
    return sets


def _resume(session, path: Path, raw: bool, err) -> None:
    """--resume FILE: load FILE's messages and KV cache when it exists. Raises ConfigError (--raw, a folder
    that does not exist, a file that is not a saved chat)."""
    from localrun.errors import ConfigError

    if raw:
        raise ConfigError("--resume continues a chat; --raw completions have no conversation",
                          hint="drop --raw, or --resume")
    path = path.expanduser()
    if not path.parent.is_dir():
        raise ConfigError(f"cannot resume {path}: the folder {path.parent} does not exist",
                          hint="create it first, or give another path")
    if not path.exists():
        return
    n = session.load(path)
    kv = f" and {session.kv_restored_tokens} tokens of KV cache" if session.kv_restored_tokens else ""
    err.print(f"resumed {n} messages{kv} from {path}", style="dim")
    for note in session.notices:
        err.print(note, style="yellow")


def _no_chat_template(path):
    """The ChatTemplateError for chatting with a base model at ``path`` (no chat template, none given)."""
    from localrun.errors import ChatTemplateError
    from localrun.store.resolve import display_name

    return ChatTemplateError(f"{display_name(path)} has no chat template: it is a base model, and chatting with it "
                             "would produce garbage",
                             hint="use --raw for plain text completion, or --chat-template chatml|llama3|gemma|FILE")


def _constraint(schema_file: Optional[Path], regex: Optional[str]):
    """--json-schema FILE / --regex → a checked ``Constraint`` (None without either), before the model
    loads. Raises ConfigError (both given, unreadable file, not JSON), ConstraintError (cannot be enforced)."""
    import json

    from localrun.backends.base import Constraint
    from localrun.constrain import check
    from localrun.errors import ConfigError

    if schema_file is not None and regex is not None:
        raise ConfigError("--json-schema and --regex both constrain the answer", hint="give one of them")
    if regex is not None:
        c = Constraint("regex", regex, param="--regex")
    elif schema_file is not None:
        try:
            schema = json.loads(schema_file.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read --json-schema {schema_file}: {e.strerror or e}",
                              hint="give the path of a JSON Schema file") from None
        except ValueError as e:
            raise ConfigError(f"--json-schema {schema_file} is not JSON: {e}",
                              hint="the file must hold one JSON Schema object") from None
        c = Constraint("json_schema", schema, param="--json-schema")
    else:
        return None
    check(c)
    return c


def _one_shot(session, text: str, raw: bool, verbose: bool, loaded, *, hide_thinking: bool = False) -> None:
    """One answer to stdout, text only. A thinking model's thinking goes to stderr, dimmed, then the
    line "thought for S s, N tokens" (``--hide-thinking``: that line only), so a pipe gets the answer alone."""
    from localrun.chat.repl import show_turn
    from localrun.chat.thinking_view import StderrThinking
    from localrun.errors import ConfigError
    from localrun.render import stderr

    if not text.strip():
        raise ConfigError("the prompt is empty", hint="pass --prompt TEXT or pipe text on stdin")
    err = stderr()
    # what the context policy drops is said before the answer (the rest of the notices after it)
    session.on_notice = lambda note: err.print(f"note: {note}", style="yellow")
    stream = session.complete(text) if raw else session.send(text.strip())
    last = show_turn(session, stream, sys.stdout, lambda th: StderrThinking(err, th, hide=hide_thinking))
    if not raw or (last and not last.text.endswith("\n")):
        sys.stdout.write("\n")
    sys.stdout.flush()
    for note in session.notices:  # dropped input, a loop cut short: said every time, on stderr
        err.print(f"note: {note}", style="yellow")
    if verbose and last and last.stats:
        from localrun.chat import stats_line

        err.print(stats_line(last.stats), style="dim")
