#!/usr/bin/env bash
# Sourced by run_local.sh and run_tests.sh: makes sure a Python with the
# project and its pinned dependencies is available, and exports it as PYTHON.
#
# With PYTHON already set, that interpreter is used as it is. Otherwise a
# virtual environment .venv/ at the repository root is created (first run:
# a few minutes of downloads from PyPI) and brought in line with
# pyproject.toml whenever that file changes, or whenever its project is not
# this checkout installed editable (a plain `pip install .` replaced it, or
# the checkout moved): `import launch` must resolve to this checkout.
# EXTRAS picks the optional dependency groups (default: pipeline,trainer,test);
# BOOTSTRAP_PYTHON the interpreter .venv is made from (default: python3). Its
# version is checked against pyproject.toml's requires-python first: pip
# would find no pinned TensorFlow for another one, after minutes of work,
# so a Python outside the range ends it with one line naming the one to
# install, before anything is created.

# VERSION SPECS: whether VERSION (3.12.4) meets every spec of SPECS
# (requires-python's ">=3.10,<3.13": >=, >, <=, < and == of X.Y[.Z]).
_bootstrap_version_ok() {
  local have want op spec i
  IFS=. read -r -a have <<< "$1"
  IFS=, read -r -a spec <<< "${2// /}"
  for op in "${spec[@]}"; do
    [[ "$op" =~ ^(>=|<=|==|>|<)([0-9]+(\.[0-9]+)*)$ ]] || return 1
    IFS=. read -r -a want <<< "${BASH_REMATCH[2]}"
    local cmp=0
    for i in 0 1 2; do
      if ((${have[i]:-0} != ${want[i]:-0})); then
        cmp=$((${have[i]:-0} < ${want[i]:-0} ? -1 : 1))
        break
      fi
    done
    case "${BASH_REMATCH[1]}" in
      ">=") ((cmp >= 0)) ;; ">") ((cmp > 0)) ;; "<=") ((cmp <= 0)) ;;
      "<") ((cmp < 0)) ;; "==") ((cmp == 0)) ;;
    esac || return 1
  done
}

# PYTHON PYPROJECT: nothing if PYTHON's version meets PYPROJECT's
# requires-python; else one line naming the Python to install, and exit 1.
_bootstrap_check_python() {
  local specs version newest named="${BOOTSTRAP_PYTHON:+BOOTSTRAP_PYTHON=}$1"
  specs="$(sed -n 's/^requires-python *= *"\(.*\)"/\1/p' "$2")"
  version="$("$1" --version 2>&1 | sed -n 's/^Python \([0-9][0-9.]*\).*/\1/p')"
  if [[ -z "$version" ]]; then
    echo "error: $named: not a Python interpreter that runs here;" \
      "install Python $specs and set BOOTSTRAP_PYTHON to it" >&2
    exit 1
  fi
  if [[ -n "$specs" ]] && ! _bootstrap_version_ok "$version" "$specs"; then
    newest="$(sed -n 's/.*<3\.\([0-9][0-9]*\).*/\1/p' <<< "$specs")"
    newest="${newest:+3.$((newest - 1))}"
    echo "error: $named is Python $version; the project needs Python" \
      "$specs (pyproject.toml's requires-python): install Python ${newest:-$specs}" \
      "and set BOOTSTRAP_PYTHON=python${newest:-3.X}, or set PYTHON to an interpreter" \
      "that has the project" >&2
    exit 1
  fi
}

if [[ -z "${PYTHON:-}" ]]; then
  _root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  _venv="$_root/.venv"
  _extras="${EXTRAS:-pipeline,trainer,test}"
  _stamp="$_venv/.installed-$(sha256sum < "$_root/pyproject.toml" | cut -c1-16)-${_extras//,/_}"
  if [[ ! -x "$_venv/bin/python" ]]; then
    _bootstrap_check_python "${BOOTSTRAP_PYTHON:-python3}" "$_root/pyproject.toml"
    echo "== creating $_venv" >&2
    "${BOOTSTRAP_PYTHON:-python3}" -m venv "$_venv"
  fi
  # -I: neither the current folder nor PYTHONPATH, only what .venv installed.
  if [[ -e "$_stamp" ]] && ! "$_venv/bin/python" -I -c 'import os, sys, launch
sys.exit(os.path.realpath(launch.__file__) != os.path.realpath(sys.argv[1]))' \
    "$_root/launch/__init__.py" 2>/dev/null; then
    echo "== $_venv: the project there is not this checkout installed editable" >&2
    rm -f "$_stamp"
  fi
  if [[ ! -e "$_stamp" ]]; then
    echo "== installing the project with extras [$_extras] into $_venv" >&2
    "$_venv/bin/python" -m pip install -q --upgrade pip >&2
    "$_venv/bin/python" -m pip install -q -e "${_root}[$_extras]" >&2
    rm -f "$_venv"/.installed-* && touch "$_stamp"
  fi
  export PYTHON="$_venv/bin/python"
fi
