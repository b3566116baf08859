#!/usr/bin/env bash
# Run the test suite from the repository root; arguments go to pytest
# (e.g. scripts/run_tests.sh tests/scripts/test_launchers.py -k dataflow).
#
# The tests start what they need themselves (the GCS emulator, subprocesses).
# Here only the environment is pinned down so runs are quiet and do not
# depend on the machine: TensorFlow's C++ info and warning logs are dropped,
# and GPUs are hidden unless CUDA_VISIBLE_DEVICES is already set (the tests
# split the CPU into logical devices for their multi-replica cases).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The suite covers every role, the Dask runner included.
export EXTRAS="${EXTRAS:-pipeline,dask,trainer,test}"
# shellcheck source=scripts/bootstrap.sh
source scripts/bootstrap.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"
export PYTHONDONTWRITEBYTECODE=1

# TEST_WORKERS pytest processes (default 2; 0: this process only), each
# taking whole files (--dist loadfile, so module-scoped fixtures such as the
# two-replica training run once). On two cores the trainer tests' TensorFlow
# start-ups and training overlap the pipeline tests' Python work and waits
# (suite times: docs/benchmarks.md).
workers=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then
  workers=(-n "${TEST_WORKERS:-2}" --dist loadfile)
fi
exec "$PYTHON" -m pytest -q ${workers[@]+"${workers[@]}"} "$@"
