"""A model's plan in a person's words, for the web page's model picker (``/ui/api/plan``): what ``localrun
fit`` says of it (quantization, where the layers go, VRAM/RAM, expected tok/s, context), as this server
would load it (its context, slots and memory caps: ``Loader.plan``), before it loads."""

from __future__ import annotations

from localrun.units import fmt_bytes


def plan_summary(name: str, path: str, plan, *, fits: bool, reasons: list[str], hardware: dict | None,
                 resident: bool, chat_template: bool | None = None) -> dict:
    """The JSON the page shows: the plan's numbers (bytes, tokens, tok/s), ``words`` (a few sentences, in
    order: what loads, where the layers go, the memory it needs, the speed to expect, whether it can chat,
    whether it fits), ``machine`` (one line), ``chat_template`` and the planner's ``reasons`` / ``warnings``.
    ``plan``: an ``offload.plan.Plan`` (None: a model whose backend does not plan, e.g. a model handed to
    the server); ``hardware``: a ``HardwareProfile`` as a dict (``to_dict``) or None; ``chat_template``:
    whether the engine has (or will have) a chat template (``--chat-template``, else the GGUF header's:
    ``loading.Prepared.has_chat_template``; None: not known before it loads, an MLX folder)."""
    def g(k: str, d=0):
        return getattr(plan, k, d) if plan is not None else d

    out = {"model": name, "path": path, "resident": resident, "fits": bool(fits), "backend": g("backend", ""),
           "quant": g("quant", ""), "n_ctx": int(g("n_ctx")), "n_ctx_train": int(g("n_ctx_train")),
           "n_parallel": int(g("n_parallel", 1)), "kv_type": g("kv_type", ""), "n_layers": int(g("n_layers")),
           "n_gpu_layers": int(g("n_gpu_layers")), "weights_bytes": int(g("weights_bytes")),
           "kv_cache_bytes": int(g("kv_cache_bytes")), "vram_bytes": int(g("vram_bytes")),
           "ram_bytes": int(g("ram_bytes")), "disk_backed_bytes": int(g("disk_backed_bytes")),
           "decode_tok_s": round(float(g("decode_tok_s", 0.0)), 1),
           "prefill_tok_s": round(float(g("prefill_tok_s", 0.0)), 1),
           "machine": machine_line(hardware), "reasons": list(reasons or g("reasons", []) or []),
           "warnings": list(g("warnings", []) or []), "chat_template": chat_template}
    out["words"] = plan_words(out) if plan is not None else ["this model was handed to the server as it is: "
                                                             "no plan to show"]
    return out


def plan_words(s: dict) -> list[str]:
    """``plan_summary``'s numbers → sentences. llama.cpp counts the output layer as one more "layer" and
    offloads the last n_gpu_layers of the n_layer + 1 (src/llama-model.cpp: i_gpu_start = n_layer + 1 -
    n_gpu_layers), so n_gpu_layers = k ≥ 1 is k - 1 repeating layers and the output layer."""
    quant = s["quant"] or "its own"
    lines = [f"{quant} weights ({fmt_bytes(s['weights_bytes'])}), a {s['n_ctx']:,}-token context"
             + (f" (trained on {s['n_ctx_train']:,})" if s["n_ctx_train"] else "")
             + (f", {s['kv_type']} KV cache" if s["kv_type"] else "")
             + (f", {s['n_parallel']} parallel sequences" if s["n_parallel"] > 1 else "") + "."]
    n, ngl = s["n_layers"], s["n_gpu_layers"]
    if s["backend"] == "mlx":
        lines.append("Runs with MLX: all layers in unified memory.")
    elif ngl <= 0:
        lines.append(f"All {n} layers run on the CPU.")
    elif ngl - 1 >= n:
        lines.append(f"All {n} layers and the output layer run on the GPU.")
    else:
        lines.append(f"{ngl - 1} of {n} layers and the output layer run on the GPU, the other {n - ngl + 1} on "
                     "the CPU.")
    need = (f"Needs about {fmt_bytes(s['vram_bytes'])} of GPU memory and {fmt_bytes(s['ram_bytes'])} of RAM"
            if s["vram_bytes"] else f"Needs about {fmt_bytes(s['ram_bytes'])} of RAM (no GPU memory)")
    if s["disk_backed_bytes"]:
        need += f", and reads {fmt_bytes(s['disk_backed_bytes'])} from disk as it goes"
    lines.append(need + ".")
    if s["decode_tok_s"]:
        lines.append(f"Expect about {s['decode_tok_s']:g} tokens/s writing"
                     + (f" and {s['prefill_tok_s']:,.0f} tokens/s reading the prompt." if s["prefill_tok_s"]
                        else "."))
    chat = s.get("chat_template") is not False
    if not chat:
        lines.append("It has no chat template, so it cannot chat: it only continues text (/v1/completions, "
                     "/api/generate). To chat with it, start the server with --chat-template FILE.")
    lines.append(("It fits on this machine." if chat else "It fits on this machine, for text completion only.")
                 if s["fits"] else "It does not fit on this machine.")
    return lines


def machine_line(hw: dict | None) -> str:
    """A ``HardwareProfile`` dict → "CPU (2 cores), 7.5 GiB RAM free, GPU NAME 24.0 GiB" ("" for None)."""
    if not hw:
        return ""
    cpu = hw.get("cpu") or {}
    parts = [f"{cpu.get('model') or 'CPU'} ({cpu.get('physical_cores', '?')} cores)",
             f"{fmt_bytes(hw.get('ram_available_bytes', 0))} RAM free"]
    for gpu in hw.get("gpus") or []:
        parts.append(f"{gpu.get('name', 'GPU')} {fmt_bytes(gpu.get('free_bytes', 0))} free")
    if not hw.get("gpus"):
        parts.append("no GPU")
    return ", ".join(parts)
