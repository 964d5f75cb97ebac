"""``python -m llama_cpp.server`` with the same AMX fix localrun's engine applies.

On CPUs that advertise AMX (``amx_tile`` in /proc/cpuinfo) llama.cpp's AMX kernels in this build die with
SIGILL on multi-token batches, so localrun loads models with ``use_extra_bufts = False``
(``localrun.backends.llamacpp.lib.cpu_advertises_amx``). This wrapper gives the peer server the same model
params — under the same condition, so both sides run the same kernels — and then runs llama_cpp.server's
own ``main()`` with the command line unchanged:

    .venv/bin/python benches/llama_cpp_server_noamx.py --model M.gguf --port 8001 --interrupt_requests False

Needs llama-cpp-python's server extras: ``pip install sse-starlette starlette-context pydantic-settings``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def patch_no_amx() -> bool:
    """Make ``llama_model_default_params()`` return ``use_extra_bufts = False`` when the CPU advertises AMX
    (as localrun does). Returns whether the patch was applied."""
    import llama_cpp.llama

    from localrun.backends.llamacpp.lib import cpu_advertises_amx

    if not cpu_advertises_amx():
        return False
    C = llama_cpp.llama.llama_cpp
    orig = C.llama_model_default_params

    def patched():
        p = orig()
        p.use_extra_bufts = False
        return p

    C.llama_model_default_params = patched
    return True


if __name__ == "__main__":
    applied = patch_no_amx()
    print(f"llama_cpp_server_noamx: use_extra_bufts=False patch {'applied' if applied else 'not needed'}",
          file=sys.stderr, flush=True)
    from llama_cpp.server.__main__ import main

    sys.argv[0] = "llama_cpp.server"
    main()
