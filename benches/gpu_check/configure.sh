#!/usr/bin/env bash
# CMake configure of llama.cpp (SRC: vendor/llama.cpp) for one CUDA architecture (ARCH: 90 for an H100/H200,
# from nvidia-smi's compute capability) into BUILD, for benches/gpu_check.sh; ARCH "cpu": the CPU + RPC
# build with the same options (the dry run's check of the stripped tree). A toolkit assembled from NVIDIA's pip wheels (as on this project's machines) can lack
# cuBLAS or the driver's stub: on a failed configure it retries with cuBLAS from the Python packages that
# ship it (nvidia/*/include/cublas_v2.h; GPU_CHECK_CUBLAS_ROOT names one), libcuda from the driver
# (ldconfig, /usr/local/nvidia, the toolkit's stubs), else without CUDA's virtual memory pool
# (GGML_CUDA_NO_VMM=ON, which needs no libcuda at link time).
#
#   bash benches/gpu_check/configure.sh SRC BUILD ARCH|cpu [PY]    (extra cmake arguments: CMAKE_EXTRA)
set -uo pipefail
SRC="$1" BUILD="$2" ARCH="$3" PY="${4:-python3}"
args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON -DGGML_NATIVE=ON
      -DGGML_CUDA_FA_ALL_QUANTS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF ${CMAKE_EXTRA:-})
if [ "$ARCH" = cpu ]; then
    exec cmake -S "$SRC" -B "$BUILD" "${args[@]}" -DGGML_CUDA=OFF
fi
args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
log="$(mktemp)"
for attempt in 1 2 3 4; do
    echo "configure attempt $attempt: cmake ${args[*]}"
    [ "$attempt" -gt 1 ] && rm -rf "$BUILD"  # a retry starts clean; the first keeps a build left by an earlier run
    cmake -S "$SRC" -B "$BUILD" "${args[@]}" 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] && { rm -f "$log"; exit 0; }
    fixed=0
    if grep -q "CUDA::cublas" "$log" && [[ " ${args[*]} " != *CUDA_cublas_LIBRARY* ]]; then
        root="${GPU_CHECK_CUBLAS_ROOT:-}"
        if [ -z "$root" ]; then
            hdr="$(find $("$PY" -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null) \
                /usr/local/cuda* /usr/include -name cublas_v2.h 2>/dev/null | head -n 1)"
            [ -n "$hdr" ] && root="$(dirname "$(dirname "$hdr")")"
        fi
        if [ -n "$root" ]; then
            echo "cuBLAS from $root"
            args+=(-DCUDA_cublas_LIBRARY="$(ls "$root"/lib*/libcublas.so* | head -n 1)"
                   -DCUDA_cublasLt_LIBRARY="$(ls "$root"/lib*/libcublasLt.so* | head -n 1)"
                   -DCMAKE_CUDA_FLAGS="-I$root/include" -DCMAKE_CXX_FLAGS="-I$root/include"
                   -DCMAKE_C_FLAGS="-I$root/include")
            fixed=1
        else
            echo "no cublas_v2.h anywhere: ggml-cuda cannot be built"
        fi
    fi
    if grep -q "CUDA::cuda_driver" "$log" && [[ " ${args[*]} " != *CUDA_cuda_driver_LIBRARY* ]] \
            && [[ " ${args[*]} " != *GGML_CUDA_NO_VMM* ]]; then
        drv="$( (ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF}';
                 find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda*/lib64/stubs \
                     /usr/local/cuda*/lib/stubs -name 'libcuda.so*' 2>/dev/null) | head -n 1)"
        if [ -n "$drv" ]; then
            echo "libcuda from $drv"
            args+=(-DCUDA_cuda_driver_LIBRARY="$drv")
        else
            echo "no libcuda to link: building with GGML_CUDA_NO_VMM=ON (the legacy memory pool)"
            args+=(-DGGML_CUDA_NO_VMM=ON)
        fi
        fixed=1
    fi
    [ "$fixed" = 1 ] || break
done
rm -f "$log"
exit 1
