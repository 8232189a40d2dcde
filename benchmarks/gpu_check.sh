#!/usr/bin/env bash
# The prepared GPU check: one GPU, no network, under 8 minutes (an H200 is expected to need 2-4).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]               on a CUDA machine (refuses to run without one)
#   bash benchmarks/gpu_check.sh --cpu-smoke [OUT_DIR]   the same steps on the CPU with a tiny shape (tests)
#
# 1. c(q) of CodeLlama-7B shapes, bf16, random weights, through the engine's verifiers (transformers' forward,
#    the static/CUDA-graph verifier the daemon uses on a GPU, and the same with attention in bf16), and the
#    projected speedup M / (c(q)/c(1)) for the draft sizes of a replay report (REPLAY=, default the committed
#    transcription of the README's replay: benchmarks/replay-humaneval-cpu.json);
# 2. exactness on the device with the tiny Qwen2 and CodeLlama-layout models, bf16 and fp32: REST against
#    plain decoding through the same verifier, plain against transformers recomputed without a cache.
# Writes OUT_DIR (default gpu-check/): env.txt, gpu-cost.json/.md, exact.json/.md, summary.md. Exit status:
# 0 all good, 1 the static verifier was not exact, 2 no CUDA (or a missing package), 3 a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=gpu
if [ "${1:-}" = "--cpu-smoke" ]; then mode=cpu; shift; fi
out=${1:-gpu-check}
mkdir -p "$out"
py=${PYTHON:-}
if [ -z "$py" ]; then if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
out_abs=$(cd "$out" && pwd)
export REST_LSP_CACHE="${REST_LSP_CACHE:-$out_abs/cache}"   # the tiny models' c(q) calibrations
replay=${REPLAY:-benchmarks/replay-humaneval-cpu.json}

wheels=${WHEELS:-.whl}
if [ "$mode" = gpu ] && compgen -G "$wheels/*.whl" >/dev/null; then
    # a machine without network: the packages its image lacks, carried as wheels (benchmarks/device_wheels.sh)
    site=$(mktemp -d)
    if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl; then
        echo "gpu_check.sh: installing the wheels in $wheels failed (made for another Python?)" >&2
        exit 2
    fi
    export PYTHONPATH="$PYTHONPATH:$site"
fi
if ! "$py" -c "import torch, transformers, tokenizers, numpy, numba, pydivsufsort, msgpack, safetensors, platformdirs" \
        2>"$out/imports.err"; then
    echo "gpu_check.sh: $py lacks a package this check needs:" >&2; tail -3 "$out/imports.err" >&2
    echo "  install the project first (TORCH_SPEC=torch bash scripts/install.sh on a CUDA machine), or, on a machine" \
         "without network, carry the wheels of benchmarks/device_wheels.sh in .whl/" >&2
    exit 2
fi
if [ "$mode" = gpu ]; then
    if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check.sh: no CUDA device here (torch.cuda.is_available() is False with $("$py" -c 'import torch; print(torch.__version__)')):" \
             "run it on a GPU machine, or pass --cpu-smoke to try the steps on the CPU with a tiny shape" >&2
        exit 2
    fi
    cost_args=(--shape codellama-7b --device cuda --dtype bf16 --past 300,1000 --repeats 5)
    exact_args=(--device cuda --precisions bf16,fp32 --prompts 3 --max-new-tokens 48)
else
    cost_args=(--shape tiny --device cpu --dtype fp32 --qs 1,2,4,8 --past 16 --repeats 1)
    exact_args=(--device cpu --precisions bf16 --prompts 1 --max-new-tokens 12)
fi

start=$(date +%s)
{
    echo "mode: $mode   started: $(date -u +%FT%TZ)   commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__); print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

status=0
echo "== 1/2 c(q) and projected speedups ($mode) =="
if ! "$py" benchmarks/gpu_cost.py "${cost_args[@]}" --replay "$replay" --json "$out/gpu-cost.json" \
        | tee "$out/gpu-cost.md"; then
    echo "gpu_check.sh: the c(q) step failed" >&2; status=3
fi
echo "== 2/2 exactness with the tiny models ($mode) =="
"$py" benchmarks/gpu_exact.py "${exact_args[@]}" --json "$out/exact.json" | tee "$out/exact.md"
rc=${PIPESTATUS[0]}
if [ "$rc" = 1 ]; then status=1; elif [ "$rc" != 0 ]; then echo "gpu_check.sh: the exactness step failed" >&2; status=3; fi

{
    echo "# gpu_check ($mode), $(($(date +%s) - start)) s"
    echo; cat "$out/env.txt"; echo; cat "$out/gpu-cost.md" 2>/dev/null; echo; cat "$out/exact.md" 2>/dev/null
} > "$out/summary.md"
echo "gpu_check.sh: done in $(($(date +%s) - start)) s, status $status; the tables are in $out/summary.md"
exit $status
