#!/usr/bin/env bash
# On an NVIDIA machine: do upstream's CUDA cases keep their outcomes once the master variant makes them parameters?
#
#   bash ci/cuda/master_variant.sh BASE.tar.gz PATCHED.tar.gz OUT_DIR FILE...
#
# BASE.tar.gz and PATCHED.tar.gz hold upstream's src/ and tests/ at the master variant's base and with the series
# applied (`git archive lightning-xpu/base src tests` and `git archive HEAD src tests` in a `lightning-xpu workspace`;
# neither is committed here). FILEs are test files relative to tests/. The python on PATH must have torch with CUDA.
# The CUDA cases (RUN_ONLY_CUDA_TESTS=1) of the files run in both trees, each tree's src/ first on PYTHONPATH; then
# compare_junit.py --by-function compares each test function's non-XPU outcomes.
set -uo pipefail
base=$(realpath "$1"); patched=$(realpath "$2"); out=$(realpath "$3"); shift 3
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
for tree in base patched; do
    dir=/tmp/master-variant-$tree; rm -rf "$dir"; mkdir -p "$dir"
    tar -xzf "$( [ $tree = base ] && echo "$base" || echo "$patched" )" -C "$dir"
    present=(); for f in "$@"; do [ -e "$dir/tests/$f" ] && present+=("$f"); done  # files the series adds: after only
    (cd "$dir/tests" && PYTHONPATH="$dir/src" RUN_ONLY_CUDA_TESTS=1 timeout "${TIMEOUT:-250}" python3 -m pytest -q -p no:cacheprovider \
        --timeout=120 "${present[@]}" --junitxml="$out/cuda-$tree.xml" > "$out/cuda-$tree.log" 2>&1)
    echo "$tree: $(tail -1 "$out/cuda-$tree.log")"
done
python3 "$here/ci/cuda/compare_junit.py" --by-function "$out/cuda-base.xml" "$out/cuda-patched.xml"
