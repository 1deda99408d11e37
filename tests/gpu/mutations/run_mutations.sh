#!/usr/bin/env bash
# Mutation check of the issue-25 GPU tests (the tests' own teeth). Run from the repository root on the GPU
# machine, after the teeth branch is merged:
#     bash tests/gpu/mutations/run_mutations.sh                 # baseline + every mutation
#     bash tests/gpu/mutations/run_mutations.sh baseline 1 2    # a subset (names or number prefixes), to fit 10-min calls
# For each mutation: `git apply` its patch (fails loudly if it does not apply), run the selected tests in one
# pytest process (no -x, so every test gets a cell; the reference side is computed once per process),
# record pass/FAIL per test with the first assertion line, revert, and print the table mutation x test last.
# Patched .cu files are compiled at run time by the machine's NVRTC (their source hash differs from the
# prebuilt RIGLLM_KERNEL_DIR images, which stay in use for every unpatched module).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(pwd)"
PY="${PYTHON:-python}"
LOGS="${MUTATION_LOGS:-/tmp/rigllm-mutation-logs}"
mkdir -p "$LOGS"
if [ ! -d "$ROOT/tests/gpu" ] || { [ ! -d "$ROOT/.git" ] && [ ! -f "$ROOT/.git" ]; }; then
    echo "run_mutations.sh: run from the repository root" >&2; exit 2
fi
if ! git -C "$ROOT" diff --quiet -- cuda_src engine; then
    echo "run_mutations.sh: cuda_src/ or engine/ has local changes; refusing to patch over them" >&2; exit 2
fi

# short names -> pytest node selections (file and -k expression)
TESTS=(
  "fix-f16|tests/gpu/test_teeth_fixture.py|test_fixture_on_one_card_matches_the_reference and f16"
  "fix-k8v3|tests/gpu/test_teeth_fixture.py|test_fixture_on_one_card_matches_the_reference and k8v3"
  "pipe2-f16|tests/gpu/test_teeth_fixture.py|test_fixture_on_logical_cards and 2-f16"
  "verify-f16|tests/gpu/test_teeth_fixture.py|test_fixture_speculative_verify_rows and f16"
  "batch|tests/gpu/test_teeth_batches.py|mixed_batch"
  "groups-g3|tests/gpu/test_teeth_head_groups.py|g3-hv1 and f16"
  "groups-g5|tests/gpu/test_teeth_head_groups.py|g5-hv4 and k8v3"
)
ALL=(baseline 1-rope-query-off-by-one 2-gdn-decay-sign-in-layer-1 3-kv-row-on-one-decode-step 4-rope-decode-query-off-by-one)

pick() {  # the mutation names selected by the arguments (full names or number prefixes)
    if [ $# -eq 0 ]; then printf '%s\n' "${ALL[@]}"; return; fi
    for want in "$@"; do
        local found=""
        for m in "${ALL[@]}"; do
            case "$m" in "$want"|"$want"-*) found="$m";; esac
        done
        [ -n "$found" ] || { echo "run_mutations.sh: unknown mutation '$want' (known: ${ALL[*]})" >&2; exit 2; }
        echo "$found"
    done
}

declare -A CELL
MUTS=()
for m in $(pick "$@"); do
    MUTS+=("$m")
    patch="$HERE/$m.patch"
    if [ "$m" != baseline ]; then
        if ! git apply --check "$patch"; then
            echo "FATAL: $m.patch does not apply to this tree; regenerate it against these files" >&2; exit 3
        fi
        git apply "$patch"
        trap 'git apply -R "'"$patch"'"; echo "reverted '"$m"' after an interruption" >&2; exit 130' INT TERM
    fi
    echo "=== $m ===" >&2
    for spec in "${TESTS[@]}"; do
        IFS='|' read -r name file expr <<<"$spec"
        log="$LOGS/$m--$name.log"
        timeout 420 "$PY" -m pytest -q -s -rA -p no:cacheprovider "$file" -k "$expr" >"$log" 2>&1
        rc=$?
        if [ $rc -eq 0 ]; then CELL["$m|$name"]="pass"
        elif [ $rc -eq 5 ]; then CELL["$m|$name"]="NO TESTS (selection '$expr' matched nothing)"
        elif [ $rc -eq 124 ]; then CELL["$m|$name"]="TIMEOUT"
        else
            why="$(grep -m1 -E '^E +(AssertionError: )?' "$log" | sed -E 's/^E +//' | cut -c1-110)"
            CELL["$m|$name"]="FAIL: ${why:-rc $rc, see $log}"
        fi
        echo "  $name: ${CELL["$m|$name"]}" >&2
    done
    if [ "$m" != baseline ]; then
        git apply -R "$patch" || { echo "FATAL: could not revert $m.patch; fix the tree by hand" >&2; exit 4; }
        trap - INT TERM
    fi
done

echo
echo "mutation x test (logs in $LOGS):"
for m in "${MUTS[@]}"; do
    echo "$m"
    for spec in "${TESTS[@]}"; do
        IFS='|' read -r name _ _ <<<"$spec"
        printf '    %-11s %s\n' "$name" "${CELL["$m|$name"]}"
    done
done
caught_all=1
for m in "${MUTS[@]}"; do
    [ "$m" = baseline ] && continue
    caught=0
    for spec in "${TESTS[@]}"; do
        IFS='|' read -r name _ _ <<<"$spec"
        case "${CELL["$m|$name"]}" in FAIL*) caught=1;; esac
    done
    [ $caught -eq 1 ] || { echo "NOT CAUGHT: $m"; caught_all=0; }
done
[ $caught_all -eq 1 ] && echo "every mutation run was caught by at least one test"
