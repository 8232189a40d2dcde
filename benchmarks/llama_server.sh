#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU) for the typing benchmark's peer:
#     bench_typing.py --methods rest,plain,llama.cpp --llama-server PATH   (benchmarks/llama_peer.py)
# and, beside it, `llama-bench` and `llama-lookup-create` for the side-by-side decoding benchmark
# (benchmarks/llama_side_by_side.py: per-token costs, and lookup decoding from a static n-gram cache).
# from the llama.cpp source that llama-cpp-python vendors in its source distribution on PyPI (no other
# network access needed). About 10 minutes on 2 cores.
#
#     bash benchmarks/llama_server.sh [OUT_DIR]      -> OUT_DIR/llama-{server,bench,lookup-create} (default: <cache>/llama.cpp)
#
# LLAMA_AMX=off builds without llama.cpp's AMX kernels (its AVX-512/VNNI kernels and weight repacking stay): on
# a 2-core virtualized Xeon with AMX (2026-12-03) the AMX build's llama-bench died of SIGSEGV on the 1.5B
# Q4_K_M, as in llama.cpp issue 20824 (a segfault in ggml_backend_amx_mul_mat on some AMX machines only).
set -euo pipefail
VERSION=0.3.36                      # llama-cpp-python; its vendor/llama.cpp is what gets built
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-${REST_LSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rest-lsp}/llama.cpp}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
flags=()
if [ "${LLAMA_AMX:-on}" = off ]; then
    # GCC lets an explicit -mno-* win over what -march=native implies, whatever the order
    flags=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF "${flags[@]}" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF > "$work/cmake.log" || { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/build" --target llama-server llama-bench llama-lookup-create -j "$(nproc)" > "$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
mkdir -p "$OUT"
for tool in llama-server llama-bench llama-lookup-create; do
    cp "$work/build/bin/$tool" "$OUT/$tool.tmp" && mv "$OUT/$tool.tmp" "$OUT/$tool"
done
echo "$OUT/llama-server"
