"""`localrun hw`: what this machine has; ``--measure`` times llama.cpp here and stores the speeds;
``--forget`` deletes them."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("hw")
    def hw(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
           measure: bool = typer.Option(False, "--measure", help="Measure this machine's effective decode "
                                        "bandwidth and prefill compute with llama.cpp (a few seconds) and "
                                        "store them for `localrun fit`, chat, serve and pull. Not stored when "
                                        "other programs or the hypervisor took the CPU meanwhile."),
           forget: bool = typer.Option(False, "--forget", help="Delete the stored measurements: plan from "
                                       "the spec tables again.")) -> None:
        """Show CPU, RAM, GPUs (NVIDIA, AMD, Intel: VRAM or a unified pool; Apple unified memory), which llama.cpp
        build would use each, and the model disk."""
        from localrun.machine.hardware import probe_hardware
        from localrun.render import print_json, stderr, stdout

        if forget:
            from localrun.machine.measurements import forget_measurements

            gone = forget_measurements()
            stderr().print(f"forgot {', '.join(gone)}" if gone else "no measurements were stored", highlight=False)
            if not measure:
                return
        from localrun.machine.hardware import build_advice, fmt_bytes, installed_backends, llamacpp_devices
        from localrun.machine.rpc import RPC_REINSTALL, probe_rpc

        prof = probe_hardware()
        rpc = probe_rpc()
        backends = installed_backends()
        builds = [build_advice(g, backends) for g in prof.gpus]
        devices = llamacpp_devices()  # what llama.cpp itself sees: the ground truth when present
        import sys

        from localrun.machine.hardware import WINDOWS_NOT_PROBED
        not_probed = WINDOWS_NOT_PROBED if sys.platform == "win32" else None
        result = measure_llamacpp_cpu() if measure else None
        if json_out:
            d = prof.to_dict()
            for g, b in zip(d["gpus"], builds):
                g["llamacpp_build"] = b
            d["llamacpp_backends"] = sorted(backends)
            d["llamacpp_devices"] = devices
            d["rpc"] = rpc.to_dict()
            if not_probed:
                d["not_probed"] = not_probed
            if result is not None:
                d["measurement"] = result
            print_json(d)
        else:
            stdout().print(prof)
            stdout().print("llama.cpp backends installed: " + (", ".join(sorted(backends)) or "none (llama-cpp-python "
                           "is not installed)") + ("" if prof.gpus else "; no GPU found: CPU only"), highlight=False)
            for g, b in zip(prof.gpus, builds):
                if b:
                    stdout().print(f"GPU {g.index} {g.name}: {b}", highlight=False)
            if not_probed:
                stdout().print(f"Not probed: {not_probed}", highlight=False)
            if devices:
                stdout().print("llama.cpp sees: " + "; ".join(
                    f"{v['name']} ({v['description']}, {fmt_bytes(v['free_bytes'])} free of "
                    f"{fmt_bytes(v['total_bytes'])})" for v in devices), highlight=False)
            stdout().print(f"RPC backend (localrun worker, llama.cpp --rpc): {rpc.detail}"
                           + ("" if rpc.available else f"; to add it: {RPC_REINSTALL}"), highlight=False)
            if result is not None:
                stdout().print(f"measured llama.cpp on the CPU: decode {result['decode_bandwidth_gbps']:.1f} GB/s "
                               f"effective, prefill {result['prefill_gflops']:.0f} GFLOP/s (stored in "
                               "measurements.json as llamacpp/cpu; fit, chat, serve and pull use it; "
                               "`localrun hw --forget` deletes it)", highlight=False)


def measure_llamacpp_cpu(n_prompt: int = 128, n_decode: int = 32, meter=None) -> dict:
    """Load the embedded default model on the CPU, prefill ``n_prompt`` tokens and decode ``n_decode``, and
    invert the planner's speed formulas on the result (``bench.calibrate.calibration_values``: the same
    bytes-per-token definition as `fit` and `bench --calibrate`). Stores and returns the ``llamacpp/cpu``
    entry of measurements.json, with the machine's load during the run (``measurements.LoadMeter``;
    ``meter`` replaces it in tests).

    Raises LocalrunError (nothing stored) when other processes or CPU steal took a share of the CPU that
    makes the numbers several times too slow."""
    from localrun.backends import load_engine
    from localrun.backends.base import SamplingParams
    from localrun.bench.calibrate import calibration_values
    from localrun.errors import LocalrunError
    from localrun.machine.measurements import LoadMeter, save_measurement
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.search import plan_for_run
    from localrun.store.resolve import default_model_path

    path = default_model_path()
    spec = read_gguf(path)
    plan = plan_for_run(spec, None, n_ctx=1024)
    eng = load_engine(str(path), plan)
    try:
        prompt = (eng.tokenize("The quick brown fox jumps over the lazy dog. " * 40))[:n_prompt]
        last = None
        with (meter or LoadMeter()) as m:
            for c in eng.generate(prompt, SamplingParams(max_tokens=n_decode, temperature=0)):
                last = c
    finally:
        eng.close()
    load = m.result()
    st = last.stats
    vals = calibration_values(spec, plan, decode_tok_s=st.decode_tok_s, prefill_tok_s=st.prefill_tok_s)
    if load["busy"]:
        raise LocalrunError(
            f"measurement not stored: the machine was busy (other processes used {load['others_cpu_frac']:.0%} "
            f"of the CPU, steal {load['steal_frac']:.0%}); it measured decode {vals['decode_bandwidth_gbps']:.1f} "
            f"GB/s, prefill {vals['prefill_gflops']:.0f} GFLOP/s, too slow to keep",
            hint="run `localrun hw --measure` again when the machine is idle; meanwhile the planner uses the "
            "spec tables (or the measurement stored before)")
    return save_measurement("llamacpp", "cpu", decode_bandwidth_gbps=round(vals["decode_bandwidth_gbps"], 2),
                            prefill_gflops=round(vals["prefill_gflops"], 1), source="hw --measure", model=path.name,
                            load={k: load[k] for k in ("steal_frac", "others_cpu_frac")})
