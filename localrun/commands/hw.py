"""`localrun hw`: what this machine has; ``--measure`` times llama.cpp here and stores the speeds."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("hw")
    def hw(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
           measure: bool = typer.Option(False, "--measure", help="Measure this machine's effective decode "
                                        "bandwidth and prefill compute with llama.cpp (a few seconds) and "
                                        "store them for `localrun fit`.")) -> None:
        """Show CPU, RAM, GPUs (VRAM, Apple unified memory) and the model disk."""
        from localrun.hardware import probe_hardware
        from localrun.render import print_json, stdout

        prof = probe_hardware()
        result = measure_llamacpp_cpu() if measure else None
        if json_out:
            d = prof.to_dict()
            if result is not None:
                d["measurement"] = result
            print_json(d)
        else:
            stdout().print(prof)
            if result is not None:
                stdout().print(f"measured llama.cpp on the CPU: decode {result['decode_bandwidth_gbps']:.1f} GB/s "
                               f"effective, prefill {result['prefill_gflops']:.0f} GFLOP/s (stored in "
                               "measurements.json as llamacpp/cpu; `localrun fit` uses it)", highlight=False)


def measure_llamacpp_cpu(n_prompt: int = 128, n_decode: int = 32) -> dict:
    """Load the embedded default model on the CPU, prefill ``n_prompt`` tokens and decode ``n_decode``;
    effective decode bandwidth = weight bytes read per token × tok/s, prefill compute = 2 × params × tok/s.
    Stores and returns the ``llamacpp/cpu`` entry of measurements.json."""
    from localrun.backends import load_engine
    from localrun.backends.base import SamplingParams
    from localrun.gguf_info import read_gguf
    from localrun.measurements import save_measurement
    from localrun.offload.plan import _read_per_token, simple_plan
    from localrun.offload.memory import split_weights
    from localrun.store import default_model_path

    path = default_model_path()
    spec = read_gguf(path)
    eng = load_engine(str(path), simple_plan(spec, None, n_ctx=1024))
    try:
        prompt = (eng.tokenize("The quick brown fox jumps over the lazy dog. " * 40))[:n_prompt]
        last = None
        for c in eng.generate(prompt, SamplingParams(max_tokens=n_decode, temperature=0)):
            last = c
    finally:
        eng.close()
    st = last.stats
    rd = _read_per_token(spec, split_weights(spec, 0), set(), False, 0)
    bw = rd["cpu"] * st.decode_tok_s / 1e9
    gflops = 2 * rd["cpu_params"] * st.prefill_tok_s / 1e9
    return save_measurement("llamacpp", "cpu", decode_bandwidth_gbps=round(bw, 2), prefill_gflops=round(gflops, 1),
                            source="hw --measure", model=path.name)
