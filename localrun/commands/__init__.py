"""CLI commands, one module per command (or group). Each exposes ``register(app: typer.Typer)``.

Modules import only typer/rich at top level; the library (and llama_cpp, mlx, fastapi) is imported
inside the command functions, so `localrun --help` stays fast.
"""
