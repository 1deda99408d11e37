#!/usr/bin/env bash
# One session's H200 work in three device calls (30 minutes of device time a session, 10 minutes a call),
# sized from the run of 2026-12-02: the whole tests/gpu suite takes 456 s alone at -n 14 (OMP_NUM_THREADS=1),
# but did not finish in 530-545 s beside the mutation run and a llama.cpp build, so each call runs one heavy job.
#
#   bash tests/gpu/run_h200_session.sh prepare   # here, on the dev machine (network, NVRTC 12.x wheels)
#   call 1: bash tests/gpu/run_h200_session.sh tests     carry [".kbz", ".whl"]   (.kbz: .kbuild packed)
#   call 2: bash tests/gpu/run_h200_session.sh bench     carry [".kbz", ".whl"]
#   call 3: bash tests/gpu/run_h200_session.sh check     carry [".whl-gpu"]   (pycuda recipe + bundle + kernels)
#   or:     bash tests/gpu/run_h200_session.sh kq        carry [".kbz", ".whl"] (K-quant GEMV tests, sweeps, benches)
#   or:     bash tests/gpu/run_h200_session.sh focus tests/gpu/test_x.py ...   carry [".kbz", ".whl"]
#   or:     RIGLLM_BASE_COMMIT=abc1234 bash tests/gpu/run_h200_session.sh ab 1 8   carry [".kbz", ".whl"]   (a
#           bit-identical kernel change: tests, the named widths' GEMV sweeps, then the 9B bench on the new tree
#           and on the base tree in one call)
#   or:     bash tests/gpu/run_h200_session.sh serve     carry [".kbz", ".whl"]   (bench streams vs rigllm serve)
#   or:     bash tests/gpu/run_h200_session.sh mtp       carry [".kbz", ".whl"]   (speculation, one card and three)
#   or:     RIGLLM_BASE_COMMIT=abc1234 bash tests/gpu/run_h200_session.sh serve-json   carry [".kbz", ".whl"]   (masked
#           steps: their GPU and API tests, then JSON-mode streams through rigllm serve, this tree and the base)
#   or:     bash tests/gpu/run_h200_session.sh q8-sweep  carry [".kbz", ".whl"]   (new Q8_0 GEMV/GDN kernels: their
#           tests, the T=1..8 sweeps, then the 9B bench with the sweeps' choices; commit the sweeps and edit
#           engine/cuda/gemv.py to what engine.cuda.bench.gemv_choice picks from them)
#   llama.cpp beside rigllm on the K-quant files (issue 29), two calls: first the 9B Q8_0 bench (streams included)
#   and llama-cpp-python's CUDA wheel from the stripped sdist (python -m engine.bench_peer.build SDIST
#   .peer/llama-stripped.tar.gz, here), whose pieces come back in $OUT/peer; copy them to .peer/wheel, then
#           bash tests/gpu/run_h200_session.sh peer-build   carry [".kbz", ".whl", ".peer"]
#           bash tests/gpu/run_h200_session.sh peer-run     carry [".kbz", ".whl", ".peer"]
#           (.whl-gpu was 52 MB on 2026-12-02 and the tree 11 MB, under the 64 MiB a call carries only without a
#           packed .kbuild: the check runs on the bundle's own kernels; if the call is refused as too big, build
#           the bundle with fewer modules or pack it harder)
#
# Results go to $OUT/results (copy them to tests/gpu/results/ and commit). Each call prints a short table last.
set -u
ROOT=$(pwd)
what=${1:-}
OUT=${OUT:-$ROOT/h200-out}
RES=$OUT/results
DAY=$(date -u +%F)
COMMIT=${RIGLLM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
BUDGET_S=${BUDGET_S:-540}

prepare() {  # .kbuild (sm_90 fatbins), .whl (the image's missing wheels, cp312), .whl-gpu (gpu_check.sh's folder)
    set -e
    python3 -m engine.cli build-kernels --out .kbuild --arch 90
    pack_kernels
    mkdir -p .whl
    cp ../shared/wheels-h200/*.whl ../shared/wheels-h200/server/*.whl .whl/
    # not on the image: the schema validator, the grammar library, keyring and what they need (the image's
    # huggingface_hub 1.x stays: transformers there refuses 2.x, so engine/hub's tests skip on the H200)
    python3 -m pip download -q -d .whl --python-version 3.12 --only-binary=:all: \
        --platform manylinux_2_31_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        "jsonschema>=4.18" "llguidance==1.9.1" "keyring>=25" diskcache
    rm -f .whl/attrs-*.whl .whl/typing_extensions-4.15*.whl
    prepare_gpu_check
    # every call then runs on the toolkit-free pycuda of packaging/pycuda-wheel, not the shared folder's build
    if ls .whl-gpu/pycuda-*.whl > /dev/null 2>&1; then rm -f .whl/pycuda-*.whl; cp .whl-gpu/pycuda-*.whl .whl/; fi
    du -sh .kbuild .whl .whl-gpu 2>/dev/null
}

pack_kernels() {  # .kbz/kbuild.tar.xz: the sm_90 fatbins packed (39 MB -> 5.2 MB on 2026-12-03), so a call carrying
    # them beside .whl stays far under the 64 MiB limit (.kbuild itself, .whl and the tree passed it that day)
    mkdir -p .kbz && tar -C .kbuild -cf - . | xz -9 -T0 > .kbz/kbuild.tar.xz
}

prepare_gpu_check() {  # .whl-gpu: the recipe's cp312 pycuda wheel, the headless bundle of this tree, kbuild.tar.xz
    local py312=${PY312:-$HOME/.pyenv/versions/3.12.1/bin/python3} venv=/tmp/rigllm-py312
    [ -x "$py312" ] || { echo "no Python 3.12 at $py312 (set PY312): .whl-gpu not built"; return; }
    rm -rf "$venv" .whl-gpu /tmp/rigllm-bundle && mkdir -p .whl-gpu
    "$py312" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" wheel -q --no-deps ./packaging/pycuda-wheel -w .whl-gpu/  # no CUDA toolkit (packaging/README.md)
    "$venv/bin/pip" install -q .whl-gpu/pycuda-*.whl -e '.[kernels]' pyinstaller==6.22.3
    "$venv/bin/rigllm" build-kernels --out resources/kernels --arch 70  # what the bundle carries
    RIGLLM_BUNDLE_HEADLESS=1 RIGLLM_BUNDLE_REQUIRE_KERNELS=1 "$venv/bin/pyinstaller" --noconfirm \
        --distpath /tmp/rigllm-bundle --workpath /tmp/rigllm-bundle-work packaging/pyinstaller/rigllm.spec
    find /tmp/rigllm-bundle/rigllm/_internal -name '*.so*' -exec strip --strip-debug {} + || true
    tar -C /tmp/rigllm-bundle -cf - rigllm | xz -9 -T0 > .whl-gpu/bundle.tar.xz
    # no kbuild.tar.xz: with it the folder and the tree passed the 64 MiB a call may carry (2026-12-02); the check
    # runs on the bundle's own kernels, as a user's rig would
    # what gpu_check.sh's steps import beyond the image (pycuda's dependencies, gguf, the grammar and schema
    # libraries); not the API stack or keyring, which would take the folder over the 64 MiB carry limit
    for w in gguf pytools platformdirs mako siphash24 typing_extensions llguidance jsonschema \
             jsonschema_specifications referencing rpds_py diskcache; do
        cp .whl/"$w"-*.whl .whl-gpu/
    done
}

setup() {  # on the H200: the carried wheels on PYTHONPATH, the prebuilt kernels (unpacked from .kbz when carried so)
    mkdir -p "$RES"
    if [ -f .kbz/kbuild.tar.xz ]; then rm -rf .kbuild && mkdir .kbuild && tar -C .kbuild -xJf .kbz/kbuild.tar.xz; fi
    local site=/tmp/rigllm-site
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl > "$RES/pip.log" 2>&1 \
        || tail -5 "$RES/pip.log"
    export PYTHONPATH="$site:$ROOT" RIGLLM_KERNEL_DIR="$ROOT/.kbuild" RIGLLM_COMMIT="$COMMIT" PYTHONDONTWRITEBYTECODE=1
    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1  # per xdist worker: 14 workers on 16 cores
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
}

# job NAME LIMIT_S COMMAND...: in the background, output in $RES/NAME.log (a header line first), exit code in NAME.rc
job() {
    local name=$1 limit=$2
    shift 2
    ( { echo "# $DAY, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $COMMIT; command: $*"
        timeout --kill-after=5 "$limit" "$@"; echo "rc=$?" > "$RES/$name.rc"; } > "$RES/$name.log" 2>&1 ) &
}

left() { echo $((BUDGET_S - SECONDS)); }

# q8_sweeps WIDTH...: the 9B Q8_0 GEMV sweep of each width, one after another, their JSON paths appended to `sweeps`
# (for tests/gpu/bench_q8_choice.py); each prints its exit code, and with SWEEP_HEAD=1 its first lines too
q8_sweeps() {
    local t
    for t in "$@"; do
        job "sweep-t$t" 60 python3 -m engine.cli bench --synthetic 9b --gemv-sweep "$t" \
            --json "$RES/$DAY-h200-gemv-sweep-9b-t$t.json"
        wait
        sweeps+=("$RES/$DAY-h200-gemv-sweep-9b-t$t.json")
        echo "sweep-t$t: $(cat "$RES/sweep-t$t.rc") ($SECONDS s)"
        if [ "${SWEEP_HEAD:-0}" = 1 ]; then head -4 "$RES/sweep-t$t.log" | tail -3; fi
    done
}

case "$what" in
prepare) prepare ;;
tests)  # every GPU test (456 s alone on 2026-12-02), each outcome live; the API suite on cuda beside it (it took
        # 103 s at -n 3 on a loaded machine: with -n 2 it slows the GPU suite for less than two minutes)
    setup
    export LIVE_REPORT="$RES/gpu-tests-live.txt"
    job gpu-tests $(($(left) - 10)) python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 14 --timeout 200 \
        -p tests.gpu.live_report -p no:benchmark --durations=20 tests/gpu
    RIGLLM_TEST_BACKEND=cuda LIVE_REPORT="$RES/api-cuda-live.txt" job api-cuda 400 python3 -m pytest -o addopts='' -q \
        -rfE -n 2 --timeout 200 -p tests.gpu.live_report tests/api --ignore=tests/api/test_api_schema_fuzz.py
    wait
    if [ "$(left)" -gt 90 ]; then  # the printed floors and errors of the one-card fixture test, while time is left
        job teeth-numbers $(($(left) - 10)) python3 -m pytest -o addopts='' -q -s -rA tests/gpu/test_teeth_fixture.py \
            -k one_card
        wait
    fi
    for f in "$RES"/*.rc; do echo "$(basename "$f" .rc): $(cat "$f")"; done
    awk '{print $2}' "$RES/gpu-tests-live.txt" | grep -E '^(passed|failed|skipped)$' | sort | uniq -c
    grep -E '^[0-9:]+ failed' "$RES"/*-live.txt | head -30 ;;
bench)  # K-quant GEMV sweeps, then decode/prefill benches in priority order while the budget lasts
    setup
    # the CLI test that the check call's folder (no API stack) failed on 2026-12-02, before anything is timed
    job generate-cli 120 python3 -m pytest -o addopts='' -q tests/gpu/test_cuda_backend.py -k generate_cli
    wait
    echo "generate-cli: $(cat "$RES/generate-cli.rc") ($SECONDS s)"
    # the Q4_K sweep and the Q8_0 / Q4_K_M pair first: issue 29's decode targets compare them in one run
    runs=(
        "sweep-9b-q4_k_m|bench --synthetic 9b --weights q4_k_m --gemv-sweep 1"
        "bench-9b-q8_0|bench --synthetic 9b --weights q8_0 --prompts 512,4096 --depths 512,4096"
        "bench-9b-q4_k_m|bench --synthetic 9b --weights q4_k_m --prompts 512,4096 --depths 512,4096"
        "bench-27b-q4_k_m|bench --synthetic 27b --weights q4_k_m --prompts 512,4096 --depths 512,4096"
        "sweep-9b-q6_k|bench --synthetic 9b --weights q6_k --gemv-sweep 1"
        "bench-27b-q8_0|bench --synthetic 27b --weights q8_0 --prompts 512,4096 --depths 512,4096"
        "sweep-9b-q5_k_m|bench --synthetic 9b --weights q5_k_m --gemv-sweep 1"
        "bench-9b-q6_k|bench --synthetic 9b --weights q6_k --prompts 512,4096 --depths 512,4096"
    )
    for r in "${runs[@]}"; do
        name=${r%%|*}
        [ "$(left)" -gt 60 ] || { echo "$name: not run (budget)"; continue; }
        job "$name" $(($(left) - 20)) python3 -m engine.cli ${r#*|} --json "$RES/$DAY-h200-$name.json"
        wait
        echo "$name: $(cat "$RES/$name.rc") ($SECONDS s)"
    done ;;
kq)  # K-quant GEMV variants: their GPU tests, the sweeps, then whole steps with the sweeps' fastest by width
    setup
    job kq-tests 240 python3 -m pytest -o addopts='' -q -rfE -n 8 --timeout 200 -p no:benchmark \
        tests/gpu/test_kquant_kernels.py tests/gpu/test_kquant_backend.py
    wait
    echo "kq-tests: $(cat "$RES/kq-tests.rc") ($SECONDS s)"; tail -3 "$RES/kq-tests.log"
    sweeps=()
    for t in q4_k_m q5_k_m q6_k; do
        job "sweep-9b-$t" 60 python3 -m engine.cli bench --synthetic 9b --weights $t --gemv-sweep 1 \
            --json "$RES/$DAY-h200-sweep-9b-$t.json"
        wait
        sweeps+=("$RES/$DAY-h200-sweep-9b-$t.json")
        grep -E "by width" "$RES/sweep-9b-$t.log"
    done
    for r in 9b:q8_0 9b:q4_k_m 27b:q4_k_m 9b:q5_k_m 9b:q6_k 27b:q8_0; do
        [ "$(left)" -gt 45 ] || { echo "$r: not run (budget)"; continue; }
        name="bench-${r%%:*}-${r#*:}"
        job "$name" $(($(left) - 15)) python3 tests/gpu/bench_kq_choice.py "${sweeps[@]}" -- bench --synthetic "${r%%:*}" \
            --weights "${r#*:}" --prompts 512 --depths 512,4096 --json "$RES/$DAY-h200-$name.json"
        wait
        echo "$name: $(cat "$RES/$name.rc") ($SECONDS s)"; grep -A3 "^depth" "$RES/$name.log"
    done ;;
focus)  # after a change to a few kernels: the GPU tests named after `focus`, the API suite on cuda beside them, then
        # the 9B Q8_0 bench (one and several streams)
    setup
    shift
    job gpu-focus $(($(left) - 60)) python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 12 --timeout 200 \
        -p no:benchmark "$@"
    RIGLLM_TEST_BACKEND=cuda job api-cuda 300 python3 -m pytest -o addopts='' -q -rfE -n 2 --timeout 200 tests/api \
        --ignore=tests/api/test_api_schema_fuzz.py
    wait
    for f in "$RES"/*.rc; do echo "$(basename "$f" .rc): $(cat "$f")"; done
    tail -2 "$RES/gpu-focus.log" "$RES/api-cuda.log"
    job bench-9b-q8_0 $(($(left) - 5)) python3 -m engine.cli bench --synthetic 9b --weights q8_0 --prompts 512 \
        --depths 512,4096 --json "$RES/$DAY-h200-bench-9b-q8_0.json"
    wait
    echo "bench-9b-q8_0: $(cat "$RES/bench-9b-q8_0.rc") ($SECONDS s)"; grep -A14 "^depth" "$RES/bench-9b-q8_0.log" ;;
mtp)  # issue 28 item 6: speculation tests on one card and over three logical cards (several slots in one round
      # too, and the head's row pick in elementwise.cu), then the 27B over 3 cards rounds against plain steps, and the 9B one-card MTP bench (with rounds of
      # 2-4 slots together against plain steps over them)
    setup
    job gpu-mtp $(($(left) - 200)) python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 12 --timeout 200 \
        -p no:benchmark tests/gpu/test_pipeline_speculation.py tests/gpu/test_mtp_gpu.py tests/gpu/test_pipeline.py \
        tests/gpu/test_speculative_sampling_gpu.py tests/gpu/test_teeth_fixture.py tests/gpu/test_slots.py \
        tests/gpu/test_slot_rounds.py tests/gpu/test_shared_prefill.py tests/gpu/test_elementwise.py
    wait
    echo "gpu-mtp: $(cat "$RES/gpu-mtp.rc") ($SECONDS s)"; tail -4 "$RES/gpu-mtp.log"
    job mtp-27b-3cards 150 python3 -m engine.cli bench --synthetic 27b --weights q8_0 --pipeline 3 --mtp \
        --depths 512 --json "$RES/$DAY-h200-mtp-27b-3cards.json"
    wait
    echo "mtp-27b-3cards: $(cat "$RES/mtp-27b-3cards.rc") ($SECONDS s)"; tail -4 "$RES/mtp-27b-3cards.log"
    job mtp-9b $(($(left) - 5)) python3 -m engine.cli bench --synthetic 9b --weights q8_0 --mtp --depths 512 \
        --json "$RES/$DAY-h200-mtp-9b.json"
    wait
    echo "mtp-9b: $(cat "$RES/mtp-9b.rc") ($SECONDS s)"; grep -E "^(MTP on|K=|  [0-9] slots together)" "$RES/mtp-9b.log" ;;
q8-sweep)  # after a change to the Q8_0 GEMV variants or the decode mixers: their GPU tests (the slow sampled-
           # distribution checks left out), every width's sweep, then the 9B Q8_0 bench (one and several streams,
           # the MTP rounds) with the sweeps' choices in place (tests/gpu/bench_q8_choice.py)
    setup
    job kernel-tests 150 python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 14 --timeout 120 -p no:benchmark \
        -k 'not keeps_the_token_distribution' tests/gpu/test_gemv.py tests/gpu/test_gdn.py tests/gpu/test_mtp_gpu.py \
        tests/gpu/test_slot_batch.py tests/gpu/test_pipeline_speculation.py
    wait
    echo "kernel-tests: $(cat "$RES/kernel-tests.rc") ($SECONDS s)"; tail -3 "$RES/kernel-tests.log"
    sweeps=()
    q8_sweeps 1 2 3 4 5 6 7 8
    job bench-9b-q8_0 $(($(left) - 5)) python3 tests/gpu/bench_q8_choice.py "${sweeps[@]}" -- bench --synthetic 9b \
        --weights q8_0 --prompts 512 --depths 512 --json "$RES/$DAY-h200-bench-9b-q8_0.json"
    wait
    echo "bench-9b-q8_0: $(cat "$RES/bench-9b-q8_0.rc") ($SECONDS s)"; grep "^T=" "$RES/bench-9b-q8_0.log"
    grep -A2 "^depth" "$RES/bench-9b-q8_0.log"; grep -A5 "^streams at" "$RES/bench-9b-q8_0.log"
    grep -A4 "^decode step at" "$RES/bench-9b-q8_0.log"; grep -A4 "^batched step" "$RES/bench-9b-q8_0.log" ;;
ab)  # a kernel change that keeps every output bit (the same sums, fewer instructions): the changed kernels' GPU tests
    # on the new build and the GEMV sweeps of the widths named after `ab`; then the 9B Q8_0 bench with those sweeps'
    # choices (tests/gpu/bench_q8_choice.py) and the base commit's bench in the same call, so both are timed in one
    # machine state. The base runs from its own tree, .kbz/base-tree.tar.xz (`git archive BASE engine cuda_src`),
    # with its build .kbz/kbuild-base.tar.xz (`rigllm build-kernels --arch 90` in a worktree of BASE): a prebuilt
    # image is used only when its source hash matches the tree it runs from.
    # AB_TESTS: the GPU tests of the changed kernels (default: the matmuls' and the batch-equality ones);
    # AB_SHAPES, AB_REPEAT: see below
    setup
    shift
    tests=${AB_TESTS:-tests/gpu/test_gemv.py tests/gpu/test_gemm.py tests/gpu/test_kquant_kernels.py \
        tests/gpu/test_slots.py tests/gpu/test_teeth_batches.py tests/gpu/test_mtp_gpu.py}
    # shellcheck disable=SC2086  # a list of paths
    job kernel-tests 240 python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 14 --timeout 150 -p no:benchmark \
        -k 'not keeps_the_token_distribution' $tests
    wait
    echo "kernel-tests: $(cat "$RES/kernel-tests.rc") ($SECONDS s)"; tail -3 "$RES/kernel-tests.log"
    sweeps=()
    SWEEP_HEAD=1 q8_sweeps "$@"
    base=/tmp/rigllm-base
    rm -rf "$base" && mkdir -p "$base/.kbuild" && tar -C "$base" -xJf .kbz/base-tree.tar.xz \
        && tar -C "$base/.kbuild" -xJf .kbz/kbuild-base.tar.xz
    # AB_SHAPES (default 9b) and AB_REPEAT (default 1): new then base for each shape, repeated, so that run-to-run
    # spread shows beside the difference; a repeat's names end in -r2, -r3, ...
    for r in $(seq 1 "${AB_REPEAT:-1}"); do
        for shape in ${AB_SHAPES:-9b}; do
            tag="$shape-q8_0"; [ "$r" = 1 ] || tag="$tag-r$r"
            bench=(bench --synthetic "$shape" --weights q8_0 --prompts 512 --depths 512)
            job "bench-$tag-new" 150 python3 tests/gpu/bench_q8_choice.py "${sweeps[@]}" -- "${bench[@]}" \
                --json "$RES/$DAY-h200-bench-$tag-new.json"
            wait
            # the base's logs and JSON name the base commit (RIGLLM_BASE_COMMIT), not this call's
            ( cd "$base" && COMMIT=${RIGLLM_BASE_COMMIT:-base} && PYTHONPATH="/tmp/rigllm-site:$base" \
              RIGLLM_KERNEL_DIR="$base/.kbuild" RIGLLM_COMMIT="$COMMIT" \
              job "bench-$tag-base" 150 python3 -m engine.cli "${bench[@]}" \
                  --json "$RES/$DAY-h200-bench-$tag-base.json"; wait )
            for side in new base; do
                echo "bench-$tag-$side: $(cat "$RES/bench-$tag-$side.rc") ($SECONDS s)"
                grep -E "^prefill|^depth|^   512|^      [1248] " "$RES/bench-$tag-$side.log"
                grep -A3 -E "^decode step at|^batched step" "$RES/bench-$tag-$side.log"
            done
        done
    done ;;
serve)  # issue 28's serve check: the 9B Q8_0 bench (its concurrent_streams), then the same stream counts through
        # `rigllm serve` and the openai client on the synthetic 9B GGUF (engine.bench_peer.serve_streams), the ratio last
    setup
    job bench-9b-q8_0 200 python3 -m engine.cli bench --synthetic 9b --weights q8_0 --prompts 512 --depths 512,4096 \
        --json "$RES/$DAY-h200-bench-9b-q8_0.json"
    wait
    echo "bench-9b-q8_0: $(cat "$RES/bench-9b-q8_0.rc") ($SECONDS s)"; grep -A5 "^streams at" "$RES/bench-9b-q8_0.log"
    grep -A11 "^constrained steps" "$RES/bench-9b-q8_0.log"
    job serve-streams $(($(left) - 10)) python3 -m engine.bench_peer.serve_streams --shape 9b --weights q8_0 \
        --streams 1,2,4,8 --max-tokens 256 --bench-json "$RES/$DAY-h200-bench-9b-q8_0.json" \
        --json "$RES/$DAY-h200-serve-streams-9b-q8_0.json"
    wait
    echo "serve-streams: $(cat "$RES/serve-streams.rc") ($SECONDS s)"; tail -8 "$RES/serve-streams.log" ;;
serve-json)  # masked steps through `rigllm serve`: the slot, sampling and batch GPU tests and the API suite's JSON and
        # tool tests on cuda, then 1 and 4 JSON-mode streams (engine.bench_peer.serve_streams --response-format
        # json_object) through this tree's server and the base tree's (RIGLLM_BASE_COMMIT, .kbz/base-tree.tar.xz with
        # .kbz/kbuild-base.tar.xz, timed by this tree's client: its bench_peer files are copied over the base's),
        # then plain streams through this tree's server
    setup
    job gpu-masks 150 python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 14 --timeout 150 -p no:benchmark \
        tests/gpu/test_slots.py tests/gpu/test_sampling.py tests/gpu/test_teeth_batches.py
    RIGLLM_TEST_BACKEND=cuda job api-json 150 python3 -m pytest -o addopts='' -q -rfE -n 2 --timeout 120 \
        -k 'json or tool or structured or grammar or schema' tests/api --ignore=tests/api/test_api_schema_fuzz.py
    # the servers' synthetic 9B GGUF (engine.bench_peer.models), written beside the tests
    job gguf-9b 240 python3 -c "from pathlib import Path; from engine.bench_peer.models import ensure_model; \
ensure_model(Path('/tmp/rigllm-peer-models'), '9b', 'q8_0')"
    wait
    for name in gpu-masks api-json gguf-9b; do echo "$name: $(cat "$RES/$name.rc") ($SECONDS s)"; tail -2 "$RES/$name.log"; done
    base=/tmp/rigllm-base
    rm -rf "$base" && mkdir -p "$base/.kbuild" && tar -C "$base" -xJf .kbz/base-tree.tar.xz \
        && tar -C "$base/.kbuild" -xJf .kbz/kbuild-base.tar.xz && cp engine/bench_peer/*.py "$base/engine/bench_peer/"
    # the server reads its chat templates from resources/, which `git archive BASE engine cuda_src` leaves out (the
    # base server failed on it in s19d); this tree's are copied when the base tree has none
    [ -d "$base/resources" ] || cp -r resources "$base/"
    serve=(python3 -m engine.bench_peer.serve_streams --shape 9b --weights q8_0 --streams 1,4 --max-tokens 256
           --models-dir /tmp/rigllm-peer-models)
    job serve-json-new 200 "${serve[@]}" --response-format json_object --json "$RES/$DAY-h200-serve-json-9b-new.json"
    wait
    ( cd "$base" && COMMIT=${RIGLLM_BASE_COMMIT:-base} && PYTHONPATH="/tmp/rigllm-site:$base" \
      RIGLLM_KERNEL_DIR="$base/.kbuild" RIGLLM_COMMIT="$COMMIT" job serve-json-base 150 "${serve[@]}" \
          --response-format json_object --json "$RES/$DAY-h200-serve-json-9b-base.json"; wait )
    job serve-text-new $(($(left) - 5)) "${serve[@]}" --json "$RES/$DAY-h200-serve-text-9b-new.json"
    wait
    for name in serve-json-new serve-json-base serve-text-new; do
        echo "$name: $(cat "$RES/$name.rc") ($SECONDS s)"; tail -4 "$RES/$name.log"
    done ;;
peer-build)  # the 9B Q8_0 decode bench (one and several streams) first, then the wheel while the 9B GGUF is written
    setup
    job bench-9b-q8_0 150 python3 -m engine.cli bench --synthetic 9b --weights q8_0 --prompts 512 --depths 512,4096 \
        --json "$RES/$DAY-h200-bench-9b-q8_0.json"
    wait
    echo "bench-9b-q8_0: $(cat "$RES/bench-9b-q8_0.rc") ($SECONDS s)"; grep -A12 "^depth" "$RES/bench-9b-q8_0.log"
    job peer-build $(($(left) - 10)) python3 -m engine.bench_peer.run --sdist .peer/llama-stripped.tar.gz --build-only \
        --shapes 9b --weights q4_k_m --out "$OUT/peer"
    wait
    echo "peer-build: $(cat "$RES/peer-build.rc") ($SECONDS s)"; tail -3 "$OUT/peer/llama-build.log"; ls -la "$OUT/peer" ;;
peer-run)  # llama.cpp (the carried wheel) and rigllm on the same synthetic Q4_K_M files, 9B then 27B
    setup
    job peer-run $(($(left) - 10)) python3 -m engine.bench_peer.run --wheel .peer/wheel --shapes 9b,27b \
        --weights q4_k_m --prompts 512,4096 --depths 512,4096 --out "$RES/peer"
    wait
    echo "peer-run: $(cat "$RES/peer-run.rc") ($SECONDS s)"; tail -40 "$RES/peer-run.log" ;;
check)  # the toolkit-free pycuda wheel and the headless bundle (packaging/gpu_check.sh), mutations 2-4 beside it
    mkdir -p "$RES" /tmp/rigllm-kbuild
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/rigllm-mut-site .whl-gpu/*.whl
    # the bundle's own kernels (sm_70 SASS + compute_70 PTX; on the H200 the image's NVRTC 13 builds sm_90 ones)
    python3 tests/gpu/unpack_check_kernels.py .whl-gpu /tmp/rigllm-kbuild/.kbuild
    ( OUT="$RES/gpu-check" BUDGET_S=$(($(left) - 20)) bash packaging/gpu_check.sh .whl-gpu /tmp/rigllm-kbuild/.kbuild \
        > "$RES/gpu-check.log" 2>&1 ) &
    rm -rf /tmp/mut && mkdir /tmp/mut && tar --exclude=./.whl-gpu -cf - . | tar -C /tmp/mut -xf -
    ( cd /tmp/mut && git init -q && git add -A && git -c user.email=h200@rigllm -c user.name=h200 commit -qm base \
      && PYTHONPATH="/tmp/rigllm-mut-site:/tmp/mut" RIGLLM_KERNEL_DIR=/tmp/rigllm-kbuild/.kbuild \
         MUTATION_LOGS="$RES/mutation-logs" timeout $(($(left) - 15)) bash tests/gpu/mutations/run_mutations.sh 2 3 4 \
         > "$RES/mutations.log" 2>&1 )
    wait
    tail -15 "$RES/gpu-check.log"; tail -12 "$RES/mutations.log" ;;
*) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2 ;;
esac
