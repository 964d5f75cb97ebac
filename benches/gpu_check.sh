#!/usr/bin/env bash
# The GPU check in one prepared call (issue 49; docs/benchmarks.md "GPU check"). On a bare NVIDIA box
# (the library's `device` machine: CUDA's nvcc, CMake, ninja, scikit-build-core, Python 3.12 without
# localrun's dependencies, no network) it builds llama.cpp for this GPU only, installs localrun offline from
# the carry, and measures localrun's plan against what llama.cpp and NVML say, and localrun's speed against
# llama.cpp's own llama-bench and llama-server built from the same tree. Ends within GPU_CHECK_BUDGET_S
# (540 s); a step that fails is reported and the next one runs. Writes report.json, report.md and
# logs.tar.gz under $OUT (or --out DIR).
#
#   bash benches/gpu_check.sh --prepare            # here: build .gpu_carry/ (wheels, stripped source, headers)
#   bash benches/gpu_check.sh --dry-run [--out D]  # here, on the CPU: every step but the CUDA ones
#   bash benches/gpu_check.sh [--out D]            # on the device, carrying .gpu_carry
#   PY=python3.12-venv/bin/python bash benches/gpu_check.sh --rehearse LIBDIR   # here: the device's install
#       path (offline pip from the carry into PY, llama-cpp-python without its build) with the llama.cpp
#       libraries of LIBDIR (a CPU build) in place of the CUDA build; measured like the dry run
#
# Options: --carry DIR (default .gpu_carry), --work DIR (default /tmp/gpu_check), --models "smollm2 gemma3",
# --no-7b (skip the 4.4 GiB random-weight 7B at the end), --quick (dry run: the smallest measurements),
# --clean (also remove the CUDA build folder that a previous run on this machine left). Environment:
# GPU_CHECK_BUDGET_S, PY (the Python; default python3 on the device, .venv/bin/python in the dry run),
# GPU_CHECK_PEER_BIN (dry run: a folder holding CPU builds of llama-bench/llama-server, default
# /tmp/peer/build/bin when it exists).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HELP="$ROOT/benches/gpu_check"
MODE=device
CARRY="$ROOT/.gpu_carry"
WORK="${GPU_CHECK_WORK:-/tmp/gpu_check}"
REPORT_DIR="${OUT:-}"
MODELS="smollm2 gemma3"
WITH_7B=1
CLEAN=0
REHEARSE=""  # --rehearse LIBDIR
QUICK=0  # --quick (the suite's dry run): one round of a few tokens, one serve level of one request
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) MODE=prepare ;;
        --dry-run) MODE=dry ;;
        --rehearse) REHEARSE="$(cd "$2" && pwd)"; shift ;;
        --carry) CARRY="$2"; shift ;;
        --work) WORK="$2"; shift ;;
        --out) REPORT_DIR="$2"; shift ;;
        --models) MODELS="$2"; shift ;;
        --no-7b) WITH_7B=0 ;;
        --quick) QUICK=1 ;;
        --clean) CLEAN=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "${PY:-}" ]; then
    if [ "$MODE" = device ]; then PY=python3; elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
    else PY=python3; fi
fi
if [ "$MODE" = prepare ]; then
    exec "$PY" "$HELP/prepare.py" --carry "$CARRY"
fi

REPORT_DIR="${REPORT_DIR:-$WORK/out}"
BUDGET="${GPU_CHECK_BUDGET_S:-540}"
RESERVE=15  # seconds kept for the report
START=$(date +%s)
# a fresh run: only what this script writes there is removed (--work may name any folder); the CUDA build
# folder stays unless --clean, so a second call on the same warm machine rebuilds nothing (tar restores
# the sources' times, ninja finds everything up to date)
rm -rf "$WORK/results" "$WORK/logs" "$WORK/models" "$WORK/src" "$WORK/build-cpu" "$WORK/home" \
    "$WORK/site" "$WORK/resolve" "$WORK/steps.tsv" "$WORK/cuda_arch"
[ "$CLEAN" = 1 ] && rm -rf "$WORK/build"
mkdir -p "$WORK/results" "$WORK/logs" "$WORK/models" "$REPORT_DIR"
STEPS="$WORK/steps.tsv"
: > "$STEPS"
BUILD="$WORK/build"
SRC="$WORK/src/llama_cpp_python-src"
JOBS="$(nproc)"
PEER_BIN="$BUILD/bin"
SMALL=0  # measure like the dry run (a CPU): the dry run and the rehearsal
if [ "$MODE" = dry ] || [ -n "$REHEARSE" ]; then
    PEER_BIN="${GPU_CHECK_PEER_BIN:-/tmp/peer/build/bin}"
    WITH_7B=0
    SMALL=1
fi
# localrun from this tree whatever pip does; $WORK/site holds llama_cpp if its pip install fails
export PYTHONPATH="$ROOT:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 LOCALRUN_HOME="$WORK/home" GPU_CHECK_MODE="$MODE${REHEARSE:+ (rehearsal)}"
export GPU_CHECK_CARRY="$CARRY" GPU_CHECK_WORK="$WORK" GPU_CHECK_MODELS="$MODELS"

elapsed() { echo $(( $(date +%s) - START )); }
say() { printf '[gpu_check %3ss] %s\n' "$(elapsed)" "$*"; }
record() {  # name status seconds detail
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(echo "$4" | tr '\t\n' '  ' | cut -c1-400)" >> "$STEPS"
}

# step NAME MAX_S MIN_S CMD...: runs CMD (log in $WORK/logs/NAME.log, echoed) under a timeout of MAX_S
# or what the budget has left; skipped when less than MIN_S is left. Never stops the script.
step() {
    local name="$1" max="$2" min="$3"; shift 3
    local left=$(( BUDGET - RESERVE - $(elapsed) ))
    if [ "$left" -lt "$min" ]; then
        say "$name: skipped (${left}s of the budget left, needs ${min}s)"
        record "$name" skipped 0 "time budget: ${left}s left, needs ${min}s"
        return 0
    fi
    local t=$(( max < left ? max : left )) t0 rc
    say "$name: start (timeout ${t}s)"
    t0=$(date +%s)
    timeout -k 5 "$t" "$@" 2>&1 | tee "$WORK/logs/$name.log"
    rc=${PIPESTATUS[0]}
    local dt=$(( $(date +%s) - t0 ))
    if [ "$rc" -eq 0 ]; then
        say "$name: ok in ${dt}s"
        record "$name" ok "$dt" ""
    elif [ "$rc" -eq 77 ]; then  # a step that decided not to run (its reason is its last log line)
        say "$name: skipped ($(tail -n 1 "$WORK/logs/$name.log"))"
        record "$name" skipped "$dt" "$(tail -n 1 "$WORK/logs/$name.log")"
    else
        local why; why="exit $rc$( [ "$rc" -eq 124 ] && echo ' (timed out)'): $(tail -n 3 "$WORK/logs/$name.log")"
        say "$name: FAILED in ${dt}s: $why"
        record "$name" failed "$dt" "$why"
    fi
    write_report > /dev/null 2>&1  # after every step: a run cut short still leaves its report in $OUT
    return 0
}
write_report() {
    "$PY" "$HELP/report.py" write "$WORK" "$REPORT_DIR" "$(elapsed)" "$BUDGET" &&
        tar czf "$REPORT_DIR/logs.tar.gz" -C "$WORK" logs results steps.tsv
}
skip() { echo "$1"; exit 77; }
export -f skip

# ---- the steps (each a function so `timeout` runs it in a child bash) --------------------------------
s_probe() {
    {
        echo "mode=$MODE jobs=$JOBS python=$("$PY" -V 2>&1) host=$(uname -m)"
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version \
            --format=csv,noheader || echo "nvidia-smi: none"
        command -v nvcc >/dev/null && nvcc --version | tail -n 2 || echo "nvcc: none"
        cmake --version | head -n 1; ninja --version
    } | tee "$WORK/results/probe.txt"
    if [ "$MODE" = device ] && [ -z "$REHEARSE" ]; then
        nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .' > "$WORK/cuda_arch"
        [ -s "$WORK/cuda_arch" ] || { echo "no compute capability from nvidia-smi"; return 1; }
    fi
}
s_carry() {
    if [ ! -f "$CARRY/manifest.json" ]; then
        [ "$MODE" = dry ] || { echo "no carry at $CARRY: run benches/gpu_check.sh --prepare here first"; return 1; }
        "$PY" "$HELP/prepare.py" --carry "$CARRY" || return 1
    fi
    "$PY" "$HELP/report.py" carry "$CARRY" "$ROOT" "$WORK/results/carry.json"
}
s_unpack() {
    [ -f "$CARRY/llama_cpp_python-src.tar.xz" ] || skip "no llama_cpp_python-src.tar.xz in the carry"
    mkdir -p "$WORK/src" && tar xJf "$CARRY/llama_cpp_python-src.tar.xz" -C "$WORK/src" && du -sh "$SRC"
}
PLATFORM_ARGS="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
--platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
--platform manylinux1_x86_64 --platform any"
s_deps() {
    [ -d "$CARRY/wheels" ] || skip "no wheels in the carry"
    if [ "$MODE" = dry ]; then  # the closure resolves for CPython 3.12 from the carried wheels alone, plus
        # the image's own (IMAGE_HAS in prepare.py, kept beside the carry); no pip configuration of this machine
        local side="${GPU_CHECK_CACHE:-/tmp/gpu_check_cache}/wheels"
        PIP_CONFIG_FILE=/dev/null "$PY" -m pip download --quiet --no-index --find-links "$CARRY/wheels" \
            --find-links "$side" $PLATFORM_ARGS -d "$WORK/resolve" -r "$CARRY/requirements.txt" || return 1
        echo "resolved for CPython 3.12 manylinux x86_64: $(ls "$WORK/resolve" | wc -l) wheels, of which from" \
            "the image (not carried): $(cd "$WORK/resolve" && ls | while read -r w; do
                [ -f "$CARRY/wheels/$w" ] || printf '%s ' "$w"; done)"
        return
    fi
    "$PY" -m pip install --no-index --find-links "$CARRY/wheels" -r "$CARRY/requirements.txt" || return 1
    "$PY" -m pip install --no-index --no-deps --no-build-isolation -e "$ROOT" ||
        echo "localrun's editable install failed: it runs from PYTHONPATH"
    "$PY" -m localrun --help > /dev/null && echo "localrun runs"
}
s_configure() {
    [ -d "$SRC" ] || skip "no unpacked source"
    [ -n "$REHEARSE" ] && skip "rehearsal: the libraries of $REHEARSE stand for the CUDA build"
    if [ "$MODE" = dry ]; then  # the stripped tree configures (CPU + RPC, the same options; no CUDA build here)
        bash "$HELP/configure.sh" "$SRC/vendor/llama.cpp" "$WORK/build-cpu" cpu "$PY" > "$WORK/logs/cmake-cpu.txt" &&
            ninja -C "$WORK/build-cpu" -t targets all | grep -E '^(llama|mtmd|llama-server|llama-bench):'
        return
    fi
    bash "$HELP/configure.sh" "$SRC/vendor/llama.cpp" "$BUILD" "$(cat "$WORK/cuda_arch")" "$PY"
}
s_build() {
    [ "$MODE" = dry ] && skip "dry run: no CUDA build; the installed venv's CPU llama_cpp is measured"
    [ -n "$REHEARSE" ] && skip "rehearsal: the libraries of $REHEARSE stand for the CUDA build"
    [ -f "$BUILD/build.ninja" ] || { echo "not configured"; return 1; }
    cmake --build "$BUILD" -j "$JOBS" --target llama mtmd llama-server llama-bench && ls -la "$BUILD/bin"
}
s_install_llama_cpp() {
    if [ "$MODE" = device ]; then  # the Python package alone (LLAMA_BUILD=OFF), then the libraries built above
        CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip install --no-index --no-deps \
            --no-build-isolation "$SRC" || { echo "pip failed: llama_cpp from $WORK/site"; mkdir -p "$WORK/site" &&
            cp -r "$SRC/llama_cpp" "$WORK/site/"; } || return 1
        local lib; lib="$("$PY" -c 'import importlib.util,pathlib;print(pathlib.Path(importlib.util.find_spec("llama_cpp").submodule_search_locations[0])/"lib")')"
        mkdir -p "$lib" && cp -a "${REHEARSE:-$BUILD/bin}"/lib*.so* "$lib"/ || return 1
    fi
    "$PY" -c 'import llama_cpp
from llama_cpp import llama_cpp as C
print("llama_cpp", llama_cpp.__version__, "from", llama_cpp.__file__, "gpu offload:", bool(C.llama_supports_gpu_offload()))'
}
s_inflate() {  # NAME: the random-weight GGUF of NAME's layout from its carried header
    [ -f "$CARRY/models/$1.head.xz" ] || skip "no $1 header in the carry"
    "$PY" "$HELP/inflate.py" "$CARRY/models/$1.head.xz" "$WORK/models/$1.gguf" --jobs "$JOBS" &&
        "$PY" "$HELP/report.py" check-model "$CARRY" "$1" "$WORK/models/$1.gguf" "$WORK/results/inflate_$1.json"
}
s_hw() { "$PY" -m localrun hw --json > "$WORK/results/hw.json"; local rc=$?; cat "$WORK/results/hw.json"; return $rc; }
s_fit() {  # NAME: `localrun fit` on the inflated model (the 7B: its header alone, truncated tensor data)
    local m="$WORK/models/$1.gguf"
    if [ ! -f "$m" ]; then
        [ -f "$CARRY/models/$1.head.xz" ] || skip "no $1 header in the carry"
        m="$WORK/models/$1.head.gguf"
        "$PY" -c 'import lzma,sys,pathlib; pathlib.Path(sys.argv[2]).write_bytes(lzma.decompress(pathlib.Path(sys.argv[1]).read_bytes()))' \
            "$CARRY/models/$1.head.xz" "$m" || return 1
    fi
    "$PY" -m localrun fit "$m" --json > "$WORK/results/fit_$1.json"
    local rc=$?
    cat "$WORK/results/fit_$1.json"
    [ "$rc" -le 1 ]  # 1 = does not fit: still a plan to report
}
s_measure() {  # NAME [tokens prompt rounds ctx threads]
    [ -f "$WORK/models/$1.gguf" ] || skip "no inflated $1"
    "$PY" "$HELP/measure.py" "$WORK/models/$1.gguf" --out "$WORK/results/measure_$1.json" \
        --llama-bench "$PEER_BIN/llama-bench" --tokens "${2:-128}" --prompt "${3:-512}" --rounds "${4:-3}" \
        ${5:+--ctx "$5"} ${6:+--threads "$6"} --fit-json "$WORK/results/fit_$1.json"
}
s_serve() {
    [ -f "$WORK/models/smollm2.gguf" ] || skip "no inflated smollm2"
    local a=(--model "$WORK/models/smollm2.gguf" --prefix-trials 0 --ctx 1024 --json "$WORK/results/serve.json")
    if [ "$QUICK" = 1 ]; then
        a+=(--levels 1 --requests-single 1 --max-tokens 4 --threads 1 --only localrun)
    elif [ "$SMALL" = 1 ]; then
        a+=(--levels 1,2 --requests 2 --requests-single 1 --max-tokens 8 --threads 1)
        if [ -x "$PEER_BIN/llama-server" ]; then a+=(--llama-server "$PEER_BIN/llama-server"); else a+=(--only localrun); fi
    else
        a+=(--levels 1,8,32 --requests 32 --requests-single 4 --max-tokens 64 --threads "$JOBS" \
            --llama-server "$PEER_BIN/llama-server" --level-timeout 60 --start-timeout 60)
    fi
    "$PY" "$ROOT/benches/serve_concurrency.py" "${a[@]}"
}
s_gpu_tests() {
    local files; files="$(grep -rlE 'mark\.(gpu|cuda)\b' "$ROOT/tests" 2>/dev/null)"
    [ -n "$files" ] || skip "no GPU-marked tests in tests/ (no pytest.mark.gpu or .cuda)"
    [ "$SMALL" = 1 ] && skip "no GPU here: GPU-marked tests need one ($files)"
    "$PY" -m pytest -p no:xdist -p no:cacheprovider -o addopts="" -q -m "gpu or cuda" $files
}
export -f s_probe s_carry s_unpack s_deps s_configure s_build s_install_llama_cpp s_inflate s_hw s_fit \
    s_measure s_serve s_gpu_tests
export MODE QUICK SMALL REHEARSE CARRY WORK ROOT HELP PY SRC BUILD JOBS PEER_BIN PLATFORM_ARGS

say "mode $MODE, carry $CARRY, work $WORK, report $REPORT_DIR, budget ${BUDGET}s, models: $MODELS"
step probe 30 5 bash -c s_probe
step carry 120 5 bash -c s_carry
step unpack 60 5 bash -c s_unpack
step deps 180 10 bash -c s_deps
step configure 120 10 bash -c s_configure
step build 330 60 bash -c s_build  # the long pole: ~4 min expected; later steps get what is left
step install_llama_cpp 120 10 bash -c s_install_llama_cpp
for m in $MODELS; do step "inflate_$m" 120 10 bash -c "s_inflate $m"; done
step hw 60 5 bash -c s_hw
for m in $MODELS deepseek7b; do step "fit_$m" 60 5 bash -c "s_fit $m"; done
for m in $MODELS; do  # the dry run on one thread: it checks that everything runs (2 threads spin on a busy 2-core box)
    if [ "$QUICK" = 1 ]; then step "measure_$m" 120 10 bash -c "s_measure $m 4 16 1 512 1"
    elif [ "$SMALL" = 1 ]; then step "measure_$m" 150 10 bash -c "s_measure $m 32 128 1 '' 1"
    else step "measure_$m" 150 20 bash -c "s_measure $m 128 512 3"; fi
done
step serve 240 40 bash -c s_serve
step gpu_tests 120 10 bash -c s_gpu_tests
if [ "$WITH_7B" = 1 ]; then  # last: the 7B at full size (4.4 GiB of random Q4_K_M), only when time is left
    step inflate_deepseek7b 90 60 bash -c "s_inflate deepseek7b"
    step measure_deepseek7b 90 40 bash -c "s_measure deepseek7b 128 512 2"
else
    record inflate_deepseek7b skipped 0 "--no-7b or dry run (4.4 GiB of random weights; the device only)"
    record measure_deepseek7b skipped 0 "--no-7b or dry run"
fi

say "report"
write_report 2>&1 || echo "gpu_check: report failed"
say "done: $REPORT_DIR/report.md, $REPORT_DIR/report.json, $REPORT_DIR/logs.tar.gz"
[ -f "$REPORT_DIR/report.md" ] && cat "$REPORT_DIR/report.md"
exit 0
