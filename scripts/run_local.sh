#!/usr/bin/env bash
# Offline demo: convert the real-digit MNIST sample that a registry package
# ships into sharded TFRecords with the local Beam runner, then train the
# small model on them and report test accuracy. Needs no network and no
# Cloud account, so it is the first thing to run on a fresh machine.
#
#   scripts/run_local.sh [extra trainer flags, e.g. --epochs=3]
#
# Environment (all optional):
#   PYTHON     interpreter with the project installed   (default: .venv, made
#              and filled by scripts/bootstrap.sh on first use)
#   DATA       where the pipeline writes shards          (default: out/mnist)
#   MODEL_DIR  checkpoints, TensorBoard logs, export     (default: runs/local-$LOOP)
#   LOOP       keras | custom                            (default: keras)
#   EPOCHS     training epochs over the 4,000 train digits (default: 8)
#   RESUME=1   keep MODEL_DIR and continue from its checkpoint; by default the
#              demo starts from scratch so reruns give comparable numbers.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/bootstrap.sh
source scripts/bootstrap.sh
LOOP="${LOOP:-keras}"
EPOCHS="${EPOCHS:-8}"
DATA="${DATA:-out/mnist}"
MODEL_DIR="${MODEL_DIR:-runs/local-${LOOP}}"

case "$LOOP" in
  keras|custom) ;;
  *) echo "error: LOOP must be keras or custom, got '$LOOP'" >&2; exit 2 ;;
esac

if [[ "${RESUME:-0}" != 1 && -e "$MODEL_DIR" ]]; then
  case "$MODEL_DIR" in
    ""|/|.|..) echo "error: refusing to clear MODEL_DIR='$MODEL_DIR'" >&2; exit 2 ;;
  esac
  rm -rf -- "$MODEL_DIR"
fi

echo "== pipeline: offline sample -> $DATA" >&2
"$PYTHON" -m pipeline --source=sample --output="$DATA" \
  --runner=DirectRunner --overwrite

echo "== trainer: $DATA -> $MODEL_DIR (loop=$LOOP)" >&2
"$PYTHON" -m trainer --data="$DATA" --model_dir="$MODEL_DIR" \
  --model=small --loop="$LOOP" --epochs="$EPOCHS" "$@"
