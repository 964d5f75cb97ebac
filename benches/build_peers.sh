#!/usr/bin/env bash
# Builds llama.cpp's own llama-server and llama-bench (the peers of benches/*.py) from the llama.cpp that
# the installed llama-cpp-python vendors, so both sides run the same kernels. Idempotent: the source is
# downloaded and unpacked once, cmake only rebuilds what changed. Prints where the binaries are.
#
#   bash benches/build_peers.sh            # → /tmp/peer/build/bin/{llama-server,llama-bench}
#   LCP_VERSION=0.3.36 PEER_DIR=/tmp/peer JOBS=2 bash benches/build_peers.sh
#
# /tmp/peer is a link to the unpacked vendor/llama.cpp (where find_llama_server in kv_tiers_peer.py looks);
# the build runs under nice -n 19 (the machine is shared).
set -euo pipefail

LCP_VERSION="${LCP_VERSION:-0.3.36}"
SRC_DIR="${SRC_DIR:-/tmp/lcp-src}"
PEER_DIR="${PEER_DIR:-/tmp/peer}"
JOBS="${JOBS:-2}"
PIP="${PIP:-$(dirname "$0")/../.venv/bin/pip}"
[ -x "$PIP" ] || PIP=pip

tarball="$SRC_DIR/llama_cpp_python-$LCP_VERSION.tar.gz"
vendor="$SRC_DIR/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"

if [ ! -f "$tarball" ]; then
    mkdir -p "$SRC_DIR"
    "$PIP" download --no-binary llama-cpp-python --no-deps "llama-cpp-python==$LCP_VERSION" -d "$SRC_DIR"
fi
if [ ! -f "$vendor/CMakeLists.txt" ]; then
    tar xzf "$tarball" -C "$SRC_DIR"
fi
if [ ! -e "$PEER_DIR" ]; then
    ln -s "$vendor" "$PEER_DIR"
elif [ "$(readlink -f "$PEER_DIR")" != "$(readlink -f "$vendor")" ]; then
    echo "warning: $PEER_DIR is not $vendor; building in $vendor" >&2
    PEER_DIR="$vendor"
fi

cd "$vendor"
if [ ! -f build/CMakeCache.txt ]; then
    nice -n 19 cmake -B build -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release
fi
start=$(date +%s)
nice -n 19 cmake --build build -j"$JOBS" --target llama-server llama-bench
echo "built in $(( $(date +%s) - start )) s (llama.cpp vendored by llama-cpp-python $LCP_VERSION)"
for b in llama-server llama-bench; do
    echo "$PEER_DIR/build/bin/$b"
done
