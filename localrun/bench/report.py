"""Showing a bench: a Rich live progress display, the results table, and ``--plot FILE.png``.

The JSON report itself is the dict ``runner.run_bench`` returns (schema in ``runner.py``); ``public``
drops the raw samples that only the plot needs.
"""

from __future__ import annotations

from localrun.machine.hardware import fmt_bytes


class LiveProgress:
    """Rich progress on stderr: one bar per concurrency level, with live output tok/s.

    Use as a context manager; pass ``level_start``/``result`` to ``run_bench``.
    """

    def __init__(self, console=None, enabled: bool = True) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                 console=console, transient=False, disable=not enabled)
        self.task = None
        self.tokens = 0
        self.t0 = 0.0

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def level_start(self, concurrency: int, n: int | None) -> None:
        import time

        if self.task is not None:
            self.progress.update(self.task, visible=True)
        self.task = self.progress.add_task(f"concurrency {concurrency}", total=n, rate="")
        self.tokens, self.t0 = 0, time.perf_counter()

    def result(self, r) -> None:
        import time

        self.tokens += r.completion_tokens
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self.progress.update(self.task, advance=1, rate=f"{self.tokens / dt:.1f} tok/s"
                             + ("" if r.ok else " [red]error[/]"))


def _ms(v) -> str:
    return "–" if v is None else f"{v * 1000:.0f}" if v >= 0.1 else f"{v * 1000:.1f}"


def _num(v, fmt="{:.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def results_table(report: dict):
    """A Rich renderable: one row per concurrency level, then predicted vs measured."""
    from rich.console import Group
    from rich.table import Table

    w = report["workload"]
    tgt = report["target"]
    title = (f"{tgt.get('model')} · {report['mode']} · prompt {w['prompt_tokens']} tok, output {w['max_tokens']} tok"
             + (f", shared prefix {w['shared_prefix']:.0%}" if w["shared_prefix"] else "")
             + (f", Poisson {w['rate_rps']} req/s" if w["rate_rps"] else ", closed loop"))
    t = Table(title=title, header_style="bold")
    for col in ("conc", "ok", "req/s", "out tok/s", "good req/s", "good tok/s", "prefill tok/s",
                "decode tok/s", "cache hit", "peak RSS", "J/tok"):
        t.add_column(col, justify="right")
    lat = Table(title="latency, milliseconds (P50 / P95 / P99)", header_style="bold")
    for col in ("conc", "TTFT", "ITL", "TPOT", "E2E"):
        lat.add_column(col, justify="right")
    for lv in report["levels"]:
        e = lv["energy"]
        g = lv["goodput"]
        t.add_row(str(lv["concurrency"]), f"{lv['completed']}/{lv['requests']}", _num(lv["requests_per_s"], "{:.2f}"),
                  _num(lv["output_tok_s"]), _num(g["requests_per_s"], "{:.2f}"), _num(g["output_tok_s"]),
                  _num(lv["prefill_tok_s"], "{:.0f}"), _num(lv["decode_tok_s"]),
                  "–" if lv["prefix_cache_hit_rate"] is None else f"{lv['prefix_cache_hit_rate']:.0%}",
                  fmt_bytes(lv["peak_rss_bytes"]) if lv["peak_rss_bytes"] else "–",
                  _num(e["j_per_output_token"], "{:.3f}") + ("*" if "estimate" in e["source"] else ""))
        lat.add_row(str(lv["concurrency"]), *(" / ".join(_ms(lv[k][p]) for p in ("p50", "p95", "p99"))
                                             for k in ("ttft_s", "itl_s", "tpot_s", "e2e_s")))
    parts = [t, lat]
    notes = []
    est = [lv["energy"] for lv in report["levels"] if "estimate" in lv["energy"]["source"]]
    if est:
        notes.append(f"* energy is an {est[0]['note']}")
    e0 = report["levels"][-1]["energy"]
    if e0["cost_per_1m_output_tokens"] is not None:
        notes.append(f"cost per 1M output tokens at {e0['price_kwh']}/kWh: {e0['cost_per_1m_output_tokens']:.3f} "
                     f"({e0['kwh_per_1m_output_tokens']:.3f} kWh)")
    slo = report["slo"]
    if slo["ttft_s"] is not None or slo["tpot_s"] is not None:
        notes.append(f"goodput SLO: TTFT ≤ {_ms(slo['ttft_s'])} ms, TPOT ≤ {_ms(slo['tpot_s'])} ms")
    pvm = report.get("predicted_vs_measured")
    if pvm:
        p = Table(title=f"planner's prediction vs measured (concurrency {pvm['concurrency']})", header_style="bold")
        for col in ("", "predicted", "measured", "measured / predicted"):
            p.add_column(col, justify="right")
        for key, fmt in (("prefill_tok_s", "{:.0f} tok/s"), ("decode_tok_s", "{:.1f} tok/s"),
                         ("ram_bytes", None), ("vram_bytes", None)):
            r = pvm[key]
            show = (lambda v: "–" if not v else fmt_bytes(v)) if fmt is None else (lambda v: _num(v, fmt))  # noqa: E731
            p.add_row(key, show(r["predicted"]), show(r["measured"]), _num(r["ratio"], "{:.2f}×"))
        parts.append(p)
    cal = report.get("calibration")
    if cal:
        notes.append(
            f"calibrated {cal['key']}: decode bandwidth {_num(cal['decode_bandwidth_gbps'], '{:.2f}')} GB/s, "
            f"prefill compute {_num(cal['prefill_gflops'], '{:.1f}')} GFLOP/s (stored; `localrun fit` uses them)"
        )
    parts.extend(notes)
    return Group(*parts)


def public(report: dict) -> dict:
    """The report without raw per-token samples (kept: per-request results and distributions)."""
    out = dict(report)
    out["levels"] = [{k: v for k, v in lv.items() if k != "samples"} for lv in report["levels"]]
    return out


def plot(report: dict, path: str) -> str:
    """Write a PNG: throughput (and goodput) vs concurrency; TTFT/TPOT percentiles vs concurrency; the
    distribution of TTFT and ITL per level. matplotlib (Agg) is imported only here. Returns ``path``."""
    try:
        import matplotlib
    except ImportError:
        from localrun.errors import BackendUnavailableError

        raise BackendUnavailableError("--plot needs matplotlib", hint="pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["levels"]
    conc = [lv["concurrency"] for lv in levels]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    fig.suptitle(
        f"localrun bench — {report['target'].get('model')} ({report['mode']}), prompt "
        f"{report['workload']['prompt_tokens']} tok, output {report['workload']['max_tokens']} tok",
        fontsize=12,
    )
    ax = axes[0][0]
    ax.plot(conc, [lv["output_tok_s"] for lv in levels], "o-", label="output tokens/s")
    slo = report["slo"]
    no_slo = slo["ttft_s"] is None and slo["tpot_s"] is None
    ax.plot(
        conc,
        [lv["goodput"]["output_tok_s"] for lv in levels],
        "s--",
        label="goodput, tokens/s"
        + (
            " (no SLO given: = throughput)"
            if no_slo
            else " within SLO ("
            + ", ".join(
                f"{k} ≤ {_ms(v)} ms" for k, v in (("TTFT", slo["ttft_s"]), ("TPOT", slo["tpot_s"])) if v is not None
            )
            + ")"
        ),
    )
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("tokens / second")
    ax.set_title("Throughput vs concurrency")
    _level_axis(ax, conc)
    ax2 = ax.twinx()
    ax2.plot(conc, [lv["requests_per_s"] for lv in levels], "^:", color="gray", label="requests/s (right axis)")
    ax2.set_ylabel("requests / second", color="gray")
    ax2.set_ylim(bottom=0)
    ax.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    for key, label, mark in (("ttft_s", "TTFT", "o"), ("tpot_s", "TPOT", "s")):
        for p, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            ax.plot(conc, [(lv[key][p] or 0) * 1000 for lv in levels], mark + style, label=f"{label} {p.upper()}")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("milliseconds")
    ax.set_yscale("log")
    ax.set_title("Latency percentiles vs concurrency")
    _level_axis(ax, conc)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, which="both")
    for ax, key, title in (
        (axes[1][0], "ttft_s", "TTFT distribution"),
        (axes[1][1], "itl_s", "Inter-token latency distribution"),
    ):
        data = [[v * 1000 for v in lv["samples"][key] if v is not None] or [0.0] for lv in levels]
        ax.boxplot(data, whis=(1, 99), showfliers=True)
        ax.set_xticks(range(1, len(levels) + 1), [str(c) for c in conc])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("milliseconds")
        ax.set_title(title + " (box P25–P75, whiskers P1–P99)", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    import os
    import tempfile

    target = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".bench-plot.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, target)  # never a half-written PNG
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _level_axis(ax, conc: list[int]) -> None:
    """x axis at the concurrency levels (log2 when they span more than 4×)."""
    if len(conc) > 1 and max(conc) / min(conc) > 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(conc, [str(c) for c in conc])
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
