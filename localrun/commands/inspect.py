"""`localrun inspect MODEL`: what a GGUF file holds, from its header alone."""

from __future__ import annotations

from typing import Optional

import typer


def projector_facts(model_path) -> dict | None:
    """The vision projector beside the model (``loading.find_mmproj``) → {path, projector_type, bytes
    (its tensors: what clip.cpp loads)}, None without one."""
    from localrun.loading import find_mmproj
    from localrun.model.gguf_info import read_gguf

    mm = find_mmproj(model_path)
    if mm is None:
        return None
    spec = read_gguf(mm)
    return {"path": str(mm), "projector_type": spec.meta(".projector_type") or spec.meta(".vision.projector_type"),
            "bytes": int(spec.tensor_bytes)}


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect(
        model: Optional[str] = typer.Argument(None,
            help="A .gguf path or a model name (default: the embedded SmolLM2)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Architecture, parameters, layers, heads, context, tensor types and chat template of a GGUF.

        Works on a file whose weights are truncated (reads only the header) and says so.
        """
        from localrun.errors import ModelFormatError
        from localrun.model.gguf_info import read_gguf
        from localrun.render import print_json, stdout
        from localrun.store.resolve import display_name, resolve_model

        path = resolve_model(model)
        if path.is_dir():
            raise ModelFormatError(str(path), "an MLX model folder; inspect reads GGUF headers",
                                   hint=f"`localrun chat {path}` runs it with MLX; its facts are in "
                                   f"{path / 'config.json'}")
        from localrun.model.capabilities import capabilities

        spec = read_gguf(path)
        info = spec.summary()
        caps = capabilities(spec, spec.chat_template)
        info["capabilities"] = caps.to_dict()
        info["mmproj"] = projector_facts(path)
        shards = getattr(spec, "shards", [])  # a split model's files (model.gguf_split.SplitModelSpec)
        info["shards"] = [{"path": s.path, "file_bytes": s.file_bytes, "weights_complete": not s.truncated}
                          for s in shards]
        if json_out:
            print_json(info)
            return
        from rich.table import Table

        from localrun.machine.hardware import fmt_bytes

        con = stdout()
        t = Table(title=f"{display_name(path)} ({spec.path})", show_header=False)
        t.add_column(style="bold")
        t.add_column()
        rows = [
            ("architecture", spec.arch),
            ("quantization", spec.file_type),
            ("parameters", f"{spec.n_params / 1e9:.3f} B" if spec.n_params >= 1e9 else f"{spec.n_params / 1e6:.1f} M"),
            ("layers", str(spec.n_layer)),
            ("embedding / FFN", f"{spec.n_embd} / {spec.n_ff}"),
            (
                "attention heads / KV heads",
                f"{spec.n_head} / {spec.n_head_kv}" + (" (GQA)" if spec.n_head_kv < spec.n_head else ""),
            ),
            ("head dim (K / V)", f"{spec.head_dim_k} / {spec.head_dim_v}"),
            (
                "sliding window",
                f"{spec.sliding_window} tokens on {sum(spec.swa_layers)} of {spec.n_layer} layers"
                if spec.sliding_window
                else "none",
            ),
            ("experts (used / total)", f"{spec.n_expert_used} / {spec.n_expert}" if spec.n_expert else "dense"),
            ("MLA latent rank", str(spec.kv_lora_rank) if spec.kv_lora_rank else "none"),
            ("training context", f"{spec.n_ctx_train:,} tokens"),
            ("vocabulary", f"{spec.vocab_size:,} tokens"),
            (
                "chat template",
                "yes" if spec.chat_template else "[yellow]none (base model: use --raw or --chat-template)[/]",
            ),
            ("capabilities", caps.line()),
            (
                "BOS / EOS",
                f"{info['bos_token']['text']!r} ({spec.bos_token_id}) / "
                f"{info['eos_token']['text']!r} ({spec.eos_token_id})",
            ),
            ("file size", fmt_bytes(spec.file_bytes)
             + (f" in {len(shards)} shards (a split model, read from its first)" if shards else "")),
            (
                "weights",
                "complete"
                if not spec.truncated
                else f"[bold red]INCOMPLETE[/]: file has {fmt_bytes(spec.file_bytes)}, header describes "
                f"{fmt_bytes(spec.expected_file_bytes)} (the tensor data is truncated; it cannot be loaded, "
                "but fit/inspect work)",
            ),
        ]
        mm = info["mmproj"]
        rows.append(("vision projector", f"{mm['path']} ({mm['projector_type']}, {fmt_bytes(mm['bytes'])}): images in"
                     if mm else "none (text only; serve/chat --mmproj FILE adds one)"))
        for k, v in rows:
            t.add_row(k, v)
        con.print(t)
        tt = Table(title="tensor types", show_header=True, header_style="bold")
        tt.add_column("type")
        tt.add_column("tensors", justify="right")
        tt.add_column("bytes", justify="right")
        tt.add_column("share", justify="right")
        total = spec.tensor_bytes or 1
        for name, d in info["tensor_types"].items():
            tt.add_row(name, str(d["n_tensors"]), fmt_bytes(d["bytes"]), f"{100 * d['bytes'] / total:.1f}%")
        con.print(tt)
