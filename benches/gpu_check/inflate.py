"""A GGUF of a real model's exact layout with random weights, from its carried header.

The device cannot download the test models and the 64 MiB carry cannot hold them (prepare.py), so the
carry holds each model's header (metadata, tokenizer, tensor table: the bytes before the tensor data) and
this writes the tensor data: every tensor at its own offset, its own type and byte size, so the file has the
real one's size and llama.cpp allocates exactly the same model, KV and compute buffers and runs the same
kernels. Values: normal(0, 0.02) weights (1-D ``*norm*`` tensors 1.0, other 1-D tensors 0.0), quantized by
ggml itself (``ggml_quantize_chunk``, ggml/include/ggml.h, from the installed llama-cpp-python's
libggml-base), so every block's scales are finite. The text such a model writes is noise; speeds and memory
are the real model's (llama.cpp's kernels do not depend on the values).

    python benches/gpu_check/inflate.py HEAD.xz OUT.gguf [--jobs N]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import lzma
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CHUNK_ELEMENTS = 1 << 22  # random floats per task (16 MiB of float32)
_lib = None


def ggml_base() -> ctypes.CDLL:
    """libggml-base of the installed llama-cpp-python (``LLAMA_CPP_LIB_PATH`` first, as llama_cpp does)."""
    d = os.environ.get("LLAMA_CPP_LIB_PATH")
    if not d:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("inflate: llama-cpp-python is not installed (its libggml-base quantizes)")
        d = str(Path(spec.submodule_search_locations[0]) / "lib")
    lib = ctypes.CDLL(str(Path(d) / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    return lib


def _fill(task: tuple) -> int:
    """One task: rows [r0, r1) of one tensor, generated and written at their offset. Returns bytes written."""
    global _lib
    import numpy as np

    path, offset, gtype, n_per_row, r0, r1, row_bytes, kind, seed = task
    n = (r1 - r0) * n_per_row
    if kind == "ones":
        src = np.ones(n, dtype=np.float32)
    elif kind == "zeros":
        src = np.zeros(n, dtype=np.float32)
    else:
        src = np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * np.float32(0.02)
    if gtype == 0:  # F32
        data = src.tobytes()
    else:
        if _lib is None:
            _lib = ggml_base()
        dst = ctypes.create_string_buffer((r1 - r0) * row_bytes)
        got = _lib.ggml_quantize_chunk(gtype, src.ctypes.data, dst, 0, r1 - r0, n_per_row, None)
        if got != (r1 - r0) * row_bytes:
            raise RuntimeError(f"ggml_quantize_chunk wrote {got} bytes, expected {(r1 - r0) * row_bytes}")
        data = dst.raw
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset + r0 * row_bytes)
    finally:
        os.close(fd)
    return len(data)


def tasks_for(spec, path: str, seed: int) -> list[tuple]:
    out = []
    for i, t in enumerate(spec.tensors):
        n_per_row = t.shape[0]
        n_rows = max(1, t.n_bytes and (_elements(t.shape) // n_per_row))
        row_bytes = t.n_bytes // n_rows
        kind = "normal" if len(t.shape) > 1 else ("ones" if "norm" in t.name else "zeros")
        step = max(1, CHUNK_ELEMENTS // n_per_row)
        for r0 in range(0, n_rows, step):
            out.append((path, spec.data_offset + t.offset, t.ggml_type, n_per_row, r0, min(n_rows, r0 + step),
                        row_bytes, kind, seed * 1_000_003 + i * 7919 + r0))
    return out


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def inflate(head_xz: str | Path, out: str | Path, jobs: int | None = None, seed: int = 0) -> dict:
    """Write ``out`` from the header in ``head_xz``. Returns {"file_bytes", "n_tensors", "seconds"}.
    Raises SystemExit when a tensor's type needs an importance matrix (IQ types: not in the test models)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from localrun.model.gguf_info import read_gguf

    t0 = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = lzma.decompress(Path(head_xz).read_bytes())
    out.write_bytes(head)
    spec = read_gguf(out)
    lib = ggml_base()
    bad = sorted({t.type_name for t in spec.tensors if t.ggml_type and lib.ggml_quantize_requires_imatrix(t.ggml_type)})
    if bad:
        raise SystemExit(f"inflate: {', '.join(bad)} need an importance matrix; not supported")
    total = spec.expected_file_bytes
    with open(out, "r+b") as f:
        f.truncate(total)
    tasks = tasks_for(spec, str(out), seed)
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1:
        written = sum(map(_fill, tasks))
    else:
        with ProcessPoolExecutor(jobs) as ex:
            written = sum(ex.map(_fill, tasks, chunksize=4))
    if written != spec.tensor_bytes:
        raise RuntimeError(f"wrote {written} tensor bytes, the table says {spec.tensor_bytes}")
    return {"file_bytes": out.stat().st_size, "n_tensors": len(spec.tensors),
            "seconds": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("head_xz")
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    r = inflate(a.head_xz, a.out, a.jobs, a.seed)
    print(f"inflate: {a.out}: {r['file_bytes']} bytes, {r['n_tensors']} tensors, {r['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
