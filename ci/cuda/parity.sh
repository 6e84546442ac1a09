#!/usr/bin/env bash
# On an NVIDIA machine: does the patched Lightning leave CUDA behaviour and speed unchanged?
#
#   bash ci/cuda/parity.sh WHEEL_DIR UPSTREAM_TESTS_DIR OUT_DIR [STEPS]
#
# WHEEL_DIR holds the three patched wheels (`lightning-xpu build`); UPSTREAM_TESTS_DIR is upstream's `tests/` at the
# release the series targets (it must not be committed here). The python on PATH must have torch with CUDA and the
# released lightning==2.6.6. The patched wheels go into a directory put first on PYTHONPATH, so the two environments
# differ only in Lightning. Upstream's CUDA tests of the touched areas run in both (RUN_ONLY_CUDA_TESTS=1)
# and then the mocked tests of the same files; each outcome is written as JUnit XML, compared by compare_junit.py.
# Then benchmarks/bench_cuda_parity.py measures throughput, patched against unpatched, in one run.
# STEPS (default "cuda mocked bench") picks some of the three, to fit each into one call of a time-limited machine.
set -uo pipefail
wheels=$(realpath "$1"); tests=$(realpath "$2"); out=$(realpath "$3"); steps=" ${4:-cuda mocked bench} "
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
site=/tmp/lightning-xpu-patched
python3 -m pip install -q --no-deps --no-index --target "$site" "$wheels"/*.whl
printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec python3 "$@"\n' "$site" > /tmp/patched-python
chmod +x /tmp/patched-python
for py in python3 /tmp/patched-python; do "$py" -c "import lightning, torch; print(lightning.__version__, torch.__version__, torch.cuda.device_count())"; done
files="tests_fabric/accelerators tests_fabric/test_connector.py tests_fabric/plugins/precision tests_fabric/strategies/test_ddp.py
tests_fabric/strategies/test_fsdp.py tests_fabric/strategies/test_model_parallel.py tests_fabric/plugins/environments
tests_fabric/strategies/launchers tests_fabric/strategies/test_ddp_integration.py tests_fabric/utilities/test_distributed.py
tests_fabric/utilities/test_device_parser.py tests_fabric/utilities/test_device_dtype_mixin.py tests_fabric/utilities/test_seed.py
tests_fabric/utilities/test_throughput.py tests_pytorch/strategies/test_fsdp.py tests_pytorch/strategies/test_model_parallel.py
tests_pytorch/accelerators tests_pytorch/trainer/connectors/test_accelerator_connector.py tests_pytorch/plugins/precision
tests_pytorch/models/test_gpu.py tests_pytorch/models/test_amp.py tests_pytorch/strategies/test_ddp.py
tests_pytorch/strategies/launchers tests_pytorch/trainer/logging_/test_distributed_logging.py
tests_pytorch/callbacks/test_throughput_monitor.py tests_pytorch/utilities/test_memory.py tests_pytorch/profilers
tests_pytorch/core/test_saving.py tests_pytorch/tuner/test_scale_batch_size.py"
cd "$tests"
for env in unpatched patched; do
    py=python3; [ "$env" = patched ] && py=/tmp/patched-python
    if [[ $steps == *" cuda "* ]]; then
        RUN_ONLY_CUDA_TESTS=1 timeout 400 "$py" -m pytest -q -p no:cacheprovider -x --timeout=120 $files --junitxml="$out/cuda-$env.xml" > "$out/cuda-$env.log" 2>&1
        echo "$env CUDA tests: $(tail -1 "$out/cuda-$env.log")"
    fi
    if [[ $steps == *" mocked "* ]]; then
        timeout 240 "$py" -m pytest -q -p no:cacheprovider -n 8 $files --junitxml="$out/mocked-$env.xml" > "$out/mocked-$env.log" 2>&1
        echo "$env mocked tests: $(tail -1 "$out/mocked-$env.log")"
    fi
done
for kind in cuda mocked; do
    [[ $steps == *" $kind "* ]] && python3 "$here/ci/cuda/compare_junit.py" "$out/$kind-unpatched.xml" "$out/$kind-patched.xml"
done
if [[ $steps == *" bench "* ]]; then
    python3 "$here/benchmarks/bench_cuda_parity.py" --unpatched python3 --patched /tmp/patched-python --rounds 3 | tee "$out/throughput.txt"
fi
