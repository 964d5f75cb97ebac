"""An agent session as Claude Code or Codex sends it, through `localrun serve` and llama.cpp's llama-server.

Six turns on one conversation: an agent-sized system prompt (instructions, project conventions and eight tool
definitions: ≈ 3,000 tokens) and a first user task; each later turn appends the
assistant's answer as the server returned it (its text, its tool call, or when the model made none a tool
call of the script's, as an agent's next step), the tool's result (a file, a test log, a diff: hundreds of
tokens) and a new user message, and sends the whole conversation again (stateless APIs: OpenAI chat
completions or Anthropic messages, streamed). Per turn: prompt tokens, cached tokens (the prompt tokens the
server did not prefill: ``usage.prompt_tokens_details.cached_tokens`` / ``cache_read_input_tokens``), reuse
= cached / prompt and its ceiling (the previous request's prompt / this one: the new turn's own tokens cannot
be cached), TTFT as the server measures it (localrun: its /metrics TTFT sum, arrival → first token;
llama-server: ``timings.prompt_ms``) and as the client sees it (the first streamed delta: text, tool call or
thinking; a tool call's first delta comes only once its name is parsed).

``--tools system`` (default) puts the tool definitions in the system prompt as text, so both servers get the
same prompt: llama-server drops a request's ``tools`` when the chat template has no tool syntax (SmolLM2's),
while localrun renders them in its generic format. ``--tools request`` sends them as the request's tools.

In the same run, llama.cpp's own llama-server (``--llama-server PATH``, env ``LLAMA_SERVER``; built from the
same vendored llama.cpp by ``benches/build_peers.sh``; skipped with a printed reason when absent) gets its own
session of the same turns: its defaults (``cache_prompt`` on, its RAM prompt cache, its flash-attention
choice), one slot, the same threads and context (``--no-repack`` where the CPU advertises AMX, the fix
localrun applies). Both servers run at once and get each turn in turn (idle while the other works), so load
drifts hit both. Printed: each turn's TTFT ratio localrun / llama-server. The goal: reuse ≥ 0.9 on turns 2–6.

    python benches/agent_session.py [--model PATH] [--api openai|anthropic] [--tools system|request]
                                    [--flash-attn default|on|off] [--threads N] [--ctx 8192]
                                    [--max-tokens 48] [--llama-server PATH] [--agent-tokens N]
                                    [--chat-template NAME] [--replies server|script]

Agent size (the issue's case: prompts of 15–30k tokens that grow a little each turn):
``--model GEMMA.gguf --chat-template gemma --ctx 32768 --agent-tokens 16000``; the workload is in
``agent_workload.py``. Printed at the end: the session's reuse fraction (cached / prompt tokens over turns
2–6) and each turn's reuse against its ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from agent_workload import FIRST_USER, STEPS, system_text, tool_list  # noqa: E402
from kv_tiers_peer import Server, find_llama_server  # noqa: E402

TURNS = 6

# ------------------------------------------------------------------------------------------ the wire


class Session:
    """One conversation on one server, in the OpenAI or Anthropic wire format."""

    def __init__(self, url: str, api: str, max_tokens: int, tools_in: str = "system", metrics: bool = False,
                 tools: list[dict] | None = None) -> None:
        self.url, self.api, self.max_tokens, self.tools_in, self.metrics = url, api, max_tokens, tools_in, metrics
        self.tools = tools if tools is not None else tool_list()
        self.system = system_text(self.tools, tools_in)
        self.messages: list[dict] = [{"role": "user", "content": FIRST_USER}]
        self.n_calls = 0

    # ---- requests
    def body(self) -> dict:
        if self.api == "openai":
            body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
                    "max_tokens": self.max_tokens,
                    "messages": [{"role": "system", "content": self.system}] + self.messages}
            if self.tools_in == "request":
                body["tools"] = [{"type": "function", "function": t} for t in self.tools]
            return body
        body = {"model": "m", "stream": True, "temperature": 0, "max_tokens": self.max_tokens, "system": self.system,
                "messages": self.messages}
        if self.tools_in == "request":
            body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                             for t in self.tools]
        return body

    def ttft_sum(self) -> float:
        """localrun's /metrics: the sum of its requests' TTFTs (arrival → first token, server side)."""
        import httpx

        text = httpx.get(self.url + "/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("localrun_time_to_first_token_seconds_sum"))

    def turn(self) -> dict:
        """Send the conversation, stream the answer → {ttft, prompt, cached, text, calls, wall}."""
        import httpx

        path = "/v1/chat/completions" if self.api == "openai" else "/v1/messages"
        before = self.ttft_sum() if self.metrics else 0.0
        t0, first = time.perf_counter(), None
        text, calls, usage, timings = [], {}, {}, {}
        with httpx.stream("POST", self.url + path, json=self.body(), timeout=3600,
                          headers={"anthropic-version": "2023-06-01", "x-api-key": "x"}) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.url}{path}: {r.status_code} {r.read()[:500]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                got = self._event(ev, text, calls, usage)
                timings = ev.get("timings") or timings
                if got and first is None:
                    first = time.perf_counter() - t0
        wall = time.perf_counter() - t0
        if self.api == "openai":
            prompt = usage.get("prompt_tokens", 0)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        else:
            cached = usage.get("cache_read_input_tokens")
            prompt = usage.get("input_tokens", 0) + (cached or 0)
        completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
        if cached is None and timings:  # llama-server's own count
            cached = int(timings.get("cache_n", 0))
        # the server's own TTFT: localrun's /metrics (arrival → first token), llama-server's prompt eval time
        server = self.ttft_sum() - before if self.metrics else (
            timings["prompt_ms"] / 1000 if timings.get("prompt_ms") is not None else None)
        return {"ttft": first if first is not None else wall, "prompt": prompt, "cached": cached or 0,
                "text": "".join(text), "calls": list(calls.values()), "wall": wall, "server_ttft": server,
                "completion": completion}

    def _event(self, ev: dict, text: list, calls: dict, usage: dict) -> bool:
        """Fold one streamed event in; True when it carries generated output."""
        if self.api == "openai":
            if ev.get("usage"):
                usage.update(ev["usage"])
            got = False
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                if d.get("content"):
                    text.append(d["content"])
                    got = True
                if d.get("reasoning_content"):
                    got = True
                for tc in d.get("tool_calls") or []:
                    c = calls.setdefault(tc.get("index", 0), {"id": "", "name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    c["id"] = tc.get("id") or c["id"]
                    c["name"] += fn.get("name") or ""
                    c["arguments"] += fn.get("arguments") or ""
                    got = True
            return got
        t = ev.get("type")
        if t == "message_start":
            usage.update(ev["message"].get("usage") or {})
        elif t == "message_delta" and ev.get("usage"):
            usage.update({k: v for k, v in ev["usage"].items() if v is not None})
        elif t == "content_block_start":
            b = ev["content_block"]
            if b.get("type") == "tool_use":
                calls[ev["index"]] = {"id": b.get("id", ""), "name": b.get("name", ""), "arguments": ""}
                return True
        elif t == "content_block_delta":
            d = ev["delta"]
            if d.get("type") == "text_delta" and d.get("text"):
                text.append(d["text"])
                return True
            if d.get("type") == "input_json_delta":
                calls[ev["index"]]["arguments"] += d.get("partial_json", "")
                return True
            if d.get("type") == "thinking_delta":
                return True
        return False

    # ---- the next turn
    def append(self, answer: dict, step: tuple) -> None:
        """The assistant's answer as returned (its tool calls, or the script's call when it made none), the
        tool's result for each call, and the next user message."""
        (name, args), result, user = step
        calls = [c for c in answer["calls"] if c["name"]]
        if not calls:
            calls = [{"id": "", "name": name, "arguments": json.dumps(args)}]
        for c in calls:
            self.n_calls += 1
            c["id"] = c["id"] or f"call_{self.n_calls:04d}"
        if self.api == "openai":
            self.messages.append({"role": "assistant", "content": answer["text"] or None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls]})
            for c in calls:
                self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
            if user:
                self.messages.append({"role": "user", "content": user})
            return
        content = ([{"type": "text", "text": answer["text"]}] if answer["text"] else []) + [
            {"type": "tool_use", "id": c["id"], "name": c["name"], "input": _json_or_raw(c["arguments"])}
            for c in calls]
        self.messages.append({"role": "assistant", "content": content})
        blocks = [{"type": "tool_result", "tool_use_id": c["id"], "content": result} for c in calls]
        self.messages.append({"role": "user", "content": blocks + ([{"type": "text", "text": user}] if user else [])})


    def append_text(self, step: tuple) -> None:
        """The script's step as plain text (``--replies script``): the assistant's turn names the call it
        makes, the tool's result and the next message come as the user's turn. No tool-call syntax, so both
        servers render the same prompt whatever their chat templates do with tool calls (llama-server's
        rendering of SmolLM2's template drops an assistant's ``tool_calls``; localrun's generic format keeps
        them)."""
        (name, args), result, user = step
        self.messages.append({"role": "assistant", "content": f"Calling {name} with {json.dumps(args)}."})
        self.messages.append({"role": "user", "content": f"Result of {name}:\n{result}" + (f"\n\n{user}"
                                                                                            if user else "")})


def _json_or_raw(s: str):
    try:
        v = json.loads(s or "{}")
        return v if isinstance(v, dict) else {"value": v}
    except json.JSONDecodeError:
        return {"raw": s}


# ------------------------------------------------------------------------------------------ the servers


def localrun_server(model: Path, args, home: Path) -> Server:
    env = dict(os.environ, LOCALRUN_HOME=str(home))
    argv = [sys.executable, "-m", "localrun", "serve", str(model), "--port", "{port}", "--parallel", "1",
            "--ctx", str(args.ctx), "--threads", str(args.threads), "--log-level", "warning"]
    if args.flash_attn != "default":
        argv.append("--flash-attn" if args.flash_attn == "on" else "--no-flash-attn")
    if args.chat_template:
        argv += ["--chat-template", args.chat_template]
    return Server("localrun serve", argv, home / "localrun.log", env)


def llama_server(binary: str, model: Path, args, home: Path) -> Server:
    from localrun.backends.llamacpp.lib import cpu_advertises_amx

    argv = [binary, "-m", str(model), "-c", str(args.ctx), "-np", "1", "-t", str(args.threads), "-tb",
            str(args.threads), "--host", "127.0.0.1", "--port", "{port}"]
    if cpu_advertises_amx():
        argv.append("--no-repack")  # llama.cpp's AMX kernels die here; localrun turns them off too
    if args.flash_attn != "default":
        argv += ["-fa", args.flash_attn]
    if args.chat_template and os.path.isfile(args.chat_template):  # a Jinja file: the same template as localrun's
        argv += ["--jinja", "--chat-template-file", args.chat_template]
    elif args.chat_template:  # a built-in name: llama.cpp's own (with --jinja it would be read as the template text)
        argv += ["--no-jinja", "--chat-template", args.chat_template]
    return Server("llama-server", argv, home / "llama-server.log")


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--api", choices=("openai", "anthropic"), default="openai")
    ap.add_argument("--threads", type=int, default=0, help="default: all cores, 1 on a busy machine")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--flash-attn", choices=("default", "on", "off"), default="default",
                    help="both servers' flash attention (default: each its own: localrun off on a CPU, "
                         "llama-server auto)")
    ap.add_argument("--tools", choices=("system", "request"), default="system",
                    help="system: the tool definitions as text in the system prompt (the same prompt on both servers: "
                         "llama-server drops a request's tools when the chat template has no tool syntax, as "
                         "SmolLM2's); request: as the request's tools (localrun renders them in its generic format)")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (default: $LLAMA_SERVER)")
    ap.add_argument("--agent-tokens", type=int, default=0,
                    help="pad the system prompt with MCP tool definitions to ≈ this many tokens (Claude Code's "
                         "first prompt: 16000; needs --ctx 32768 and a model that takes it, e.g. Gemma-3-270M)")
    ap.add_argument("--chat-template", default=None, help="both servers' chat template: a Jinja file (llama-server: "
                                                          "--chat-template-file) or a built-in name; the packaged "
                                                          "Gemma-3-270M's file has none (tests/templates/gemma3.jinja)")
    ap.add_argument("--replies", choices=("server", "script"), default="server",
                    help="the assistant turns appended: each server's own answer (an agent's case; the two "
                         "conversations then differ) or the script's step as plain text for both (the same prompts "
                         "on both servers, so each turn's TTFT ratio compares like with like; each server must cut "
                         "its cache back past the answer it generated)")
    args = ap.parse_args()
    from localrun.store.resolve import default_model_path

    model = Path(args.model) if args.model else default_model_path()
    peer_bin, why = find_llama_server(args.llama_server)
    if args.threads <= 0:
        args.threads = 1 if os.getloadavg()[0] > (os.cpu_count() or 1) else (os.cpu_count() or 1)
    print(f"agent_session: {model.name}, {args.api} API, tools in the {args.tools}, {TURNS} turns, ctx {args.ctx}, "
          f"threads {args.threads}, flash attention {args.flash_attn}, "
          f"max_tokens {args.max_tokens}, replies {args.replies}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at start"
          + ("" if peer_bin else f"; llama-server comparison skipped: {why}"), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        home = Path(tmp)
        servers = [localrun_server(model, args, home)]
        if peer_bin:
            servers.append(llama_server(peer_bin, model, args, home))
        rows: dict[str, list[dict]] = {}
        try:
            for s in servers:
                s.start()
            tools = tool_list(args.agent_tokens)
            sessions = {s.name: Session(s.url, args.api, args.max_tokens, args.tools,
                                        metrics=s.name == "localrun serve", tools=tools) for s in servers}
            for k in range(TURNS):
                for s in servers:
                    sess = sessions[s.name]
                    r = sess.turn()
                    rows.setdefault(s.name, []).append(r)
                    if k < len(STEPS):
                        if args.replies == "server":
                            sess.append(r, STEPS[k])
                        else:  # the same text on both servers: no tool-call syntax for a template to render
                            sess.append_text(STEPS[k])
                line = [f"turn {k + 1}:"]
                for s in servers:
                    r = rows[s.name][k]
                    reuse = r["cached"] / r["prompt"] if r["prompt"] else 0.0
                    made = "tool call " + ",".join(c["name"] for c in r["calls"]) if r["calls"] else "text"
                    kept = ""
                    if k:  # the previous request's prompt is all a prefix cache can hold of this one, and more
                        prev = rows[s.name][k - 1]["prompt"]
                        kept = (f", ceiling {prev / r['prompt']:.2f}: previous prompt "
                                + ("all kept" if r["cached"] >= prev else f"{prev - r['cached']} tokens short")
                                + (f" +{r['cached'] - prev} of the answer" if r["cached"] > prev else ""))
                    line.append(f"{s.name}: {r['prompt']} prompt, {r['cached']} cached (reuse {reuse:.2f}{kept}), "
                                f"TTFT {_s(r['server_ttft'])} (first delta {r['ttft']:.3f} s, {made});")
                if peer_bin:
                    a, b = rows[servers[0].name][k], rows[servers[1].name][k]
                    line.append(f"TTFT localrun/llama-server {_ratio(a['server_ttft'], b['server_ttft'])} "
                                f"(first delta {a['ttft'] / b['ttft']:.2f}×; the whole turn "
                                f"{a['wall'] / b['wall']:.2f}×, {a['wall']:.1f} s vs {b['wall']:.1f} s, "
                                f"{a['completion']} vs {b['completion']} tokens written)")
                print("  " + " ".join(line), flush=True)
        except Exception:
            for s in servers:
                if s.log.is_file():
                    print(f"--- {s.name} log tail:\n{s.log.read_text(errors='replace')[-3000:]}")
            raise
        finally:
            for s in servers:
                s.stop()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    for name, rs in rows.items():
        later = [r["cached"] / r["prompt"] if r["prompt"] else 0.0 for r in rs[1:]]
        worst = min(later) if later else 0.0
        ceiling = [p["prompt"] / r["prompt"] if r["prompt"] else 0.0 for p, r in zip(rs, rs[1:])]
        short = sum(max(0, p["prompt"] - r["cached"]) for p, r in zip(rs, rs[1:]))
        total = sum(r["cached"] for r in rs[1:]) / max(1, sum(r["prompt"] for r in rs[1:]))
        print(f"  {name}: over turns 2–{len(rs)}, {total:.3f} of all prompt tokens came from the cache "
              f"(the session's reuse fraction; goal ≥ 0.9: {'met' if total >= 0.9 else 'NOT met'})")
        print(f"  {name}: reuse on turns 2–{len(rs)} min {worst:.2f}, mean {sum(later) / max(1, len(later)):.2f} "
              f"(goal ≥ 0.9: {'met' if worst >= 0.9 else 'NOT met'}; ceiling min {min(ceiling, default=0):.2f}: "
              f"the new turn's own tokens; previous prompts " + ("all reused" if not short else
                                                                  f"{short} tokens short in all") +
              f"); TTFT turn 1 {_s(rs[0]['server_ttft'])}, turns 2–{len(rs)} "
              + " ".join(_s(r["server_ttft"]) for r in rs[1:]))
    if peer_bin and len(rows) == 2:
        a, b = (rows[s.name] for s in servers)
        print("  TTFT localrun / llama-server per turn (server side): "
              + " ".join(_ratio(x["server_ttft"], y["server_ttft"]) for x, y in zip(a, b))
              + "; first streamed delta: " + " ".join(f"{x['ttft'] / y['ttft']:.2f}×" for x, y in zip(a, b)))
        print("  the whole turn (request → last byte), localrun / llama-server: "
              + " ".join(f"{x['wall'] / y['wall']:.2f}×" for x, y in zip(a, b))
              + f"; the session {sum(x['wall'] for x in a):.1f} s vs {sum(y['wall'] for y in b):.1f} s "
              f"({sum(x['wall'] for x in a) / max(1e-9, sum(y['wall'] for y in b)):.2f}×)")


def _s(x: float | None) -> str:
    return "?" if x is None else f"{x:.3f} s"


def _ratio(a: float | None, b: float | None) -> str:
    return "?" if not a or not b else f"{a / b:.2f}×"


if __name__ == "__main__":
    main()
