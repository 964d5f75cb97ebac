"""What a model is, read from its files alone: the GGUF header reader (``gguf_info``: GGUF → ModelSpec),
the curated catalog (``catalog``: models.toml → entries), and chat templates (``chat_template``).
No I/O beyond reading the model's own files and the catalog; imports only the foundation."""
