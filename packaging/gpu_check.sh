#!/usr/bin/env bash
# GPU check of the toolkit-free pycuda and of the bundle, on a Linux machine with an NVIDIA driver and a
# python3 (3.12 for the carried cp312 wheels), run from the repository root:
#
#   packaging/gpu_check.sh [WHEEL_DIR] [KERNEL_DIR]        # defaults: .whl-gpu .kbuild
#
# WHEEL_DIR holds the pycuda wheel built on the CPU machine by packaging/pycuda-wheel (no CUDA toolkit),
# its runtime dependencies, gguf and the API stack's wheels, and bundle.tar.xz (a headless PyInstaller
# bundle: pycuda from the same recipe, prebuilt sm_70 SASS + compute_70 PTX kernels). The GPU tests take
# their kernels from KERNEL_DIR if it is a folder (`rigllm build-kernels --out .kbuild --arch 90`), else
# from WHEEL_DIR/kbuild.tar.xz (the same, packed: it is a fifth of the size), else from the bundle (its
# compute_70 PTX, which the driver JIT-compiles). Each step's output goes to $OUT/<step>.log
# (./gpu-check-logs without $OUT); a failing step does not stop the others; the last lines are a table of
# the steps and their exit codes. BUDGET_S (default 570) bounds the whole run: the pytest step gets what
# the steps before it left.
set -u
set -x
WHEELS=${1:-.whl-gpu}
KERNELS=${2:-.kbuild}
LOGS=${OUT:-$PWD/gpu-check-logs}
SITE=/tmp/rigllm-gpu-check/site
BUNDLE=/tmp/rigllm-gpu-check/bundle
BUDGET_S=${BUDGET_S:-570}
mkdir -p "$LOGS" "$SITE" "$BUNDLE"
STEPS=()
CODES=()

# step NAME TIMEOUT_S COMMAND...: run it with a time limit, tee its output to $LOGS/NAME.log, record its exit code.
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== step $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== step $name: exit code $rc"
    STEPS+=("$name")
    CODES+=("$rc")
}

# The bundle runs with no PYTHONPATH and a fresh data folder, so it uses only what it carries.
BUNDLE_RIGLLM=(env -u PYTHONPATH -u RIGLLM_KERNEL_DIR RIGLLM_DATA_DIR=/tmp/rigllm-gpu-check/bundle-data
               "$BUNDLE/rigllm/rigllm")

step machine 30 bash -c 'nvidia-smi; python3 --version; uname -a; ldd --version | head -1; ls -la "$0"' "$WHEELS"
step install 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl
export PYTHONPATH=$SITE
step pycuda 60 python3 - <<'EOF'
import os, pycuda, pycuda.driver as cuda
folder = os.path.dirname(pycuda.__file__)
print("pycuda", pycuda.VERSION_TEXT, "from", folder)
print("compiled against CUDA headers", cuda.get_version(), "(12.9 = NVIDIA's pip wheels, not this machine's toolkit)")
print("driver CUDA level", cuda.get_driver_version())
print(open(os.path.join(folder, "RIGLLM_BUILD.txt")).read().strip())
cuda.init()
print("devices:", [cuda.Device(i).name() for i in range(cuda.Device.count())])
EOF
step pycuda-links 20 bash -c 'readelf -d "$0"/pycuda/_driver*.so | grep NEEDED; ldd "$0"/pycuda/_driver*.so | grep -i cuda' "$SITE"
step doctor 60 python3 -m engine.cli doctor
# Python unpacks it (no xz binary needed); filter="tar" keeps the executable bits
step bundle-unpack 90 python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
    "$WHEELS/bundle.tar.xz" "$BUNDLE"
step bundle-doctor 60 "${BUNDLE_RIGLLM[@]}" doctor
step bundle-generate 120 "${BUNDLE_RIGLLM[@]}" generate --backend cuda --prompt Hi
step bundle-bench 150 "${BUNDLE_RIGLLM[@]}" bench --synthetic 0.8b
if [ -d "$KERNELS" ]; then
    KERNEL_DIR=$(cd "$KERNELS" && pwd)
elif [ -f "$WHEELS/kbuild.tar.xz" ]; then
    step kernels-unpack 60 python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
        "$WHEELS/kbuild.tar.xz" /tmp/rigllm-gpu-check
    KERNEL_DIR=/tmp/rigllm-gpu-check/kbuild
else
    KERNEL_DIR=$BUNDLE/rigllm/_internal/resources/kernels
fi
echo "=== kernels for the GPU tests: $KERNEL_DIR"
LEFT=$((BUDGET_S - SECONDS))
step gpu-tests $((LEFT > 60 ? LEFT : 60)) env RIGLLM_KERNEL_DIR="$KERNEL_DIR" python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_driver.py tests/gpu/test_gemv.py tests/gpu/test_cuda_backend.py

set +x
{
    echo "step             exit code"
    for i in "${!STEPS[@]}"; do printf '%-16s %s\n' "${STEPS[$i]}" "${CODES[$i]}"; done
    echo "total ${SECONDS}s"
} | tee "$LOGS/summary.txt"
