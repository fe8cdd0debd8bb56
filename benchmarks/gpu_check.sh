#!/usr/bin/env bash
# The GPU check of opscope's bundled kernels: one log holding
#   1. the GPU tests: CUDA and Triton backends against PyTorch, forward and backward, fp32/bf16/fp16
#      (tests/kernels/test_kernels_cuda.py; conftest leaves Triton compiled where torch sees a GPU);
#   2. `opscope kernels --tune --device cuda`: the Triton forwards' launches (BLOCK, num_warps, num_stages
#      over each manifest's [tune.triton] space), cached for this run; then `opscope kernels --bench
#      --device cuda` for both backends at bandwidth-bound shapes (--scale 2: 8192x8192, softmax
#      32x2048x2048), Triton on the tuned launches;
#   3. `opscope profile` of the examples on the GPU;
#   4. one `opscope swap` per bundled kernel.
# It installs nothing: it runs this checkout in place (PYTHONPATH) with the machine's Python, torch,
# Triton, pytest and nvcc, so it works on a machine that cannot download. Each step has its own timeout
# and all of them share a budget of BUDGET_S seconds (default 285), so the whole check ends within 5
# minutes on one GPU: a step gets at most what is left, and once nothing is left the remaining steps are
# logged as skipped. A step that fails or times out is logged and the next one runs.
# Without a GPU it says so and exits 1, running nothing.
#
#   benchmarks/gpu_check.sh [LOG]     (default benchmarks/results/gpu-check-<UTC time>.log)
#   PYTHON=/path/to/python            the interpreter to use (default: python3)
#   GPU_CHECK_COMPILE=1               also time torch.compile in the benchmark (adds minutes)
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"   # cpp_extension's parallel nvcc jobs for the CUDA extension
STAMP="$(date -u +%Y%m%d-%H%M%S)"
LOG="${1:-$REPO/benchmarks/results/gpu-check-$STAMP.log}"
mkdir -p "$(dirname "$LOG")"
: > "$LOG"

say() { echo "$*" | tee -a "$LOG"; }

# "GPU present" as torch decides it, never by a device node (an H200 machine had no /dev/nvidia0)
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.version.cuda else 1)" \
        >>"$LOG" 2>&1; then
    say "gpu_check: no CUDA GPU that torch can use here (torch.cuda.is_available() is False, or torch is" \
        "missing or CPU-only): nothing was run. Log: $LOG"
    exit 1
fi

BUDGET_S="${BUDGET_S:-285}"
FAILED=()
WORK="$(mktemp -d "${TMPDIR:-/tmp}/opscope-gpu-check.XXXXXX")"  # run folders; the log is what stays
export OPSCOPE_KERNELS_BUILD_DIR="${OPSCOPE_KERNELS_BUILD_DIR:-$WORK/kernels-build}"
step() {  # step NAME SECONDS COMMAND...: run it (within what is left of the budget), log its output and end
    local name="$1" limit="$2"
    shift 2
    local left=$((BUDGET_S - SECONDS))
    if [ "$left" -lt 5 ]; then
        say "=== $name: SKIPPED (the ${BUDGET_S}s budget is spent) ==="
        FAILED+=("$name (skipped)")
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    say ""
    say "=== $name (limit ${limit}s) ==="
    say "\$ $*"
    local start=$SECONDS rc
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        say "=== $name: TIMEOUT after $((SECONDS - start))s ==="
        FAILED+=("$name (timeout)")
    elif [ "$rc" -ne 0 ]; then
        say "=== $name: FAILED (exit $rc) in $((SECONDS - start))s ==="
        FAILED+=("$name (exit $rc)")
    else
        say "=== $name: ok in $((SECONDS - start))s ==="
    fi
}

say "opscope GPU check, $(date -u +%FT%TZ), $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
"$PYTHON" - >>"$LOG" 2>&1 <<'EOF'
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda)
print("gpu", torch.cuda.get_device_name(0), "|", torch.cuda.device_count(), "device(s)")
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton: not installed")
EOF
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
fi
if command -v nvcc >/dev/null; then nvcc --version 2>&1 | tail -1 >>"$LOG"; else say "nvcc: not on PATH"; fi

# 1. GPU tests (the first CUDA test builds the extension: about a minute with nvcc on all cores; the
#    slow nvcc-per-file compile checks are CI's, left out here)
step "GPU tests" 150 env -u TRITON_INTERPRET "$PYTHON" -m pytest -q -rs -p no:cacheprovider -m "not slow" \
    tests/kernels/test_kernels_cuda.py tests/kernels/test_kernels_gpu_mode.py

# 2. the Triton launches tuned on the manifests' cases (their table goes to the log; a case tuned before
#    the step's limit stays cached for the bench), then kernel benchmarks, both GPU backends,
#    bandwidth-bound shapes
export OPSCOPE_CACHE_DIR="$WORK/cache"
step "tune triton" 60 env OPSCOPE_KERNELS_GPU_BACKEND=triton "$PYTHON" -m opscope kernels --tune --device cuda \
    --scale 2 --repeats 5
COMPILE=(--no-compile)
[ "${GPU_CHECK_COMPILE:-0}" = "1" ] && COMPILE=()
for backend in triton cuda; do
    step "bench $backend" 45 env OPSCOPE_KERNELS_GPU_BACKEND="$backend" "$PYTHON" -m opscope kernels --bench \
        --device cuda --scale 2 --repeats 7 "${COMPILE[@]}" --out "$WORK/bench-$backend"
done

# 3. profiles of the examples on the GPU
for example in mlp transformer_block llama_block convnet; do
    step "profile $example" 25 "$PYTHON" -m opscope profile "examples/$example.py" --device cuda \
        --out "$WORK/profile-$example"
done

# 4. one swap per bundled kernel, on an example holding its op
declare -A SWAP_ON=([rms_norm]=llama_block [swiglu]=llama_block [softmax]=llama_block [mean]=llama_block
                    [sum]=llama_block [layer_norm]=transformer_block [bias_gelu]=transformer_block
                    [broadcast_add]=transformer_block)
for kernel in $("$PYTHON" -c "from reference_kernels.manifest import load_manifests
print(' '.join(m.name for m in load_manifests()))"); do
    example="${SWAP_ON[$kernel]:-transformer_block}"
    step "swap $kernel" 12 "$PYTHON" -m opscope swap "examples/$example.py" --device cuda --kernel "$kernel" \
        --repeats 5
done

say ""
if [ "${#FAILED[@]}" -eq 0 ]; then
    say "gpu_check: every step passed in ${SECONDS}s. Log: $LOG"
    status=0
else
    say "gpu_check: ${#FAILED[@]} step(s) did not pass in ${SECONDS}s: ${FAILED[*]}. Log: $LOG"
    status=1
fi
rm -rf "$WORK"
exit "$status"
