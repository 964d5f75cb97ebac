"""`localrun bench`: serving metrics in-process or against any OpenAI-compatible server."""

from __future__ import annotations

from typing import Optional

import typer


def _ctx_option(value: Optional[str]) -> Optional[int]:
    """``-c/--ctx-size`` as in llama.cpp: tokens of context. ``bench -c 1,4,8`` (the concurrency, in
    localrun's first releases) is refused with a pointer to ``--concurrency``."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 64:
        raise typer.BadParameter(f"{value!r} is not a context size: -c/--ctx-size sets tokens of context (at "
                                 f"least 64), as in llama.cpp. For concurrency levels use --concurrency {value}")
    return n


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        model: Optional[str] = typer.Argument(None,
            help="A .gguf path or model name (default: the embedded SmolLM2). Ignored with --url."),
        url: Optional[str] = typer.Option(None, "--url",
            help="Bench a running OpenAI-compatible server (localrun serve, llama-server, Ollama, vLLM), e.g. "
                 "http://127.0.0.1:11500."),
        model_name: Optional[str] = typer.Option(None, "--model-name",
            help="Model name to send with --url (default: the first of /v1/models)."),
        api_key: Optional[str] = typer.Option(None, "--api-key", envvar="LOCALRUN_API_KEY",
            help="Bearer key for --url."),
        endpoint: str = typer.Option("completions", "--endpoint",
            help="completions (raw prompt, exact length) or chat, with --url."),
        scenario_name: Optional[str] = typer.Option(None, "--scenario",
            help="chat | rag | agent (sets lengths and shared prefix; flags override)."),
        prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens",
            help="Prompt length, tokens (default 128)."),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", "--n-predict", "-n",
            help="Output length, tokens (default 128)."),
        concurrency: str = typer.Option("1", "--concurrency", help="Concurrency levels, e.g. 1,4,8,16."),
        shared_prefix: Optional[float] = typer.Option(None, "--shared-prefix",
            help="Fraction 0..1 of each prompt shared by all requests."),
        requests: Optional[int] = typer.Option(None, "--requests",
            help="Requests per level (default 4 × concurrency, at least 8)."),
        duration: Optional[float] = typer.Option(None, "--duration",
            help="Seconds per level instead of a request count."),
        rate: Optional[float] = typer.Option(None, "--rate",
            help="Poisson arrivals at this many requests/s (default: closed loop)."),
        ignore_eos: bool = typer.Option(True, "--ignore-eos/--allow-eos",
            help="Generate exactly --max-tokens (EOS banned)."),
        seed: int = typer.Option(0, "--seed", "-s", help="Seed for prompts and arrivals."),
        slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="Goodput SLO on TTFT, seconds."),
        slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="Goodput SLO on TPOT, seconds."),
        price_kwh: Optional[float] = typer.Option(None, "--price-kwh",
            help="Electricity price per kWh, for cost per 1M output tokens."),
        ctx: Optional[str] = typer.Option(None, "--ctx", "--ctx-size", "-c", callback=_ctx_option, metavar="TOKENS",
            help="Context per sequence, in-process (default: what the workload needs). Concurrency is --concurrency."),
        threads: Optional[int] = typer.Option(None, "--threads", "-t", min=1,
            help="CPU threads, in-process (default: the plan's, physical cores)."),
        calibrate: bool = typer.Option(False, "--calibrate",
            help="Store this machine's measured bandwidth and compute for the planner (in-process)."),
        warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="Send one unmeasured request first."),
        spec_mode: Optional[str] = typer.Option(None, "--spec", metavar="auto|ngram|draft|off",
                                      help="Speculative decoding in-process (llama.cpp); off by default (auto with "
                                           "--draft-model): not lossless on the CPU (a verify step takes other "
                                           "kernels than a one-token step: logprobs move by up to ~0.3 nat and "
                                           "greedy or seeded text can change; docs/chat.md, Not exact)."),
        draft_model: Optional[str] = typer.Option(None, "--draft-model", metavar="MODEL",
                                                  help="Draft model for --spec auto/draft (same vocabulary)."),
        draft_max: Optional[int] = typer.Option(None, "--draft-max", min=0, metavar="N",
                                                help="Drafted tokens per verify step at most (default 16)."),
        rpc: Optional[str] = typer.Option(None, "--rpc", metavar="HOST:PORT,…",
            help="RPC workers (`localrun worker`) to split the in-process model over, planned per device."),
        json_out: bool = typer.Option(False, "--json",
            help="Print the report as JSON (stable schema localrun.bench/1)."),
        plot_file: Optional[str] = typer.Option(None, "--plot",
            help="Write throughput and latency charts to FILE.png."),
    ) -> None:
        """TTFT, ITL, TPOT, throughput, P50/P95/P99 and goodput per concurrency level; predicted vs measured."""
        import os
        import sys

        from localrun.bench import BenchOptions, Workload, run_bench, scenario
        from localrun.bench.report import LiveProgress, plot, public, results_table
        from localrun.bench.workload import parse_concurrency
        from localrun.errors import ConfigError
        from localrun.render import print_json, stderr, stdout

        levels = parse_concurrency(concurrency)
        fields = dict(prompt_tokens=prompt_tokens, max_tokens=max_tokens, concurrency=levels,
                      shared_prefix=shared_prefix, requests=requests, duration_s=duration, rate_rps=rate,
                      seed=seed, ignore_eos=ignore_eos)
        if scenario_name:
            w = scenario(scenario_name, **fields)
        else:
            w = Workload(**{k: v for k, v in fields.items() if v is not None})
        if calibrate and url:
            raise ConfigError("--calibrate measures this machine in-process; it cannot be combined with --url",
                              hint="drop --url (the planner models localrun's own engine)")
        if plot_file:
            d = os.path.dirname(os.path.abspath(plot_file))
            if not os.path.isdir(d):
                raise ConfigError(f"--plot: no such directory {d}", hint="create it or choose another path")
        for name, v in (("--slo-ttft", slo_ttft), ("--slo-tpot", slo_tpot), ("--price-kwh", price_kwh)):
            if v is not None and v <= 0:
                raise ConfigError(f"{name} must be > 0, got {v}")
        from localrun.backends.spec_decode import spec_mode_or_default

        spec_mode = spec_mode_or_default(spec_mode, draft_model)
        opts = BenchOptions(model=model, url=url, model_name=model_name, api_key=api_key, endpoint=endpoint,
                            slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, price_kwh=price_kwh, n_ctx=ctx, n_threads=threads,
                            calibrate=calibrate, warmup=warmup, spec_mode=spec_mode, draft_model=draft_model,
                            draft_max=draft_max, rpc=rpc)
        with LiveProgress(console=stderr(), enabled=sys.stderr.isatty()) as prog:
            report = run_bench(w, opts, on_level_start=prog.level_start, on_result=prog.result)
        if plot_file:
            plot(report, plot_file)
        if json_out:
            print_json(public(report))
        else:
            out = stdout()
            out.print(results_table(report))
            if plot_file:
                out.print(f"plot written to {plot_file}")
