#!/usr/bin/env bash
# Run the test suite from the repository root; arguments go to pytest
# (e.g. scripts/run_tests.sh tests/launch/test_dataflow.py -k dataflow).
#
# --under-load (anywhere among the arguments; not passed on): one busy loop
# per core (nproc) runs beside the suite, as on a CI machine whose cores are
# all taken; they are stopped when the script ends, however it ends, and the
# exit status is pytest's (128+N when signal N stopped the script).
#
# The tests start what they need themselves (the GCS emulator, subprocesses).
# Here only the environment is pinned down so runs are quiet and do not
# depend on the machine: TensorFlow's C++ info and warning logs are dropped,
# and GPUs are hidden unless CUDA_VISIBLE_DEVICES is already set (the tests
# split the CPU into logical devices for their multi-replica cases).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

under_load=0
args=()
for arg in "$@"; do
  if [[ "$arg" == "--under-load" ]]; then under_load=1; else args+=("$arg"); fi
done

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
pytest=("$PYTHON" -m pytest -q ${workers[@]+"${workers[@]}"} ${args[@]+"${args[@]}"})
if (( ! under_load )); then
  exec "${pytest[@]}"
fi

# One core's worth of work until it is killed; should this script be killed
# with no trap run (SIGKILL), it ends by itself once the script is reaped. It
# holds none of the script's output streams, so a caller reading those until
# they close is not held up by it.
busy_loop() {
  while kill -0 "$$" 2>/dev/null; do
    for ((n = 0; n < 100000; n++)); do :; done
  done
}

busy=()
# shellcheck disable=SC2329  # called by the EXIT trap
stop_busy() {
  if (( ${#busy[@]} )); then
    kill "${busy[@]}" 2>/dev/null || true
    wait "${busy[@]}" 2>/dev/null || true
    busy=()
  fi
}
trap stop_busy EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cores="$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"
for ((core = 0; core < cores; core++)); do
  busy_loop < /dev/null > /dev/null 2>&1 &
  busy+=("$!")
done
status=0
"${pytest[@]}" || status=$?
exit "$status"
