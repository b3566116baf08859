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
# EXTRAS picks the optional dependency groups (default: pipeline,trainer,test).

if [[ -z "${PYTHON:-}" ]]; then
  _root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  _venv="$_root/.venv"
  _extras="${EXTRAS:-pipeline,trainer,test}"
  _stamp="$_venv/.installed-$(sha256sum < "$_root/pyproject.toml" | cut -c1-16)-${_extras//,/_}"
  if [[ ! -x "$_venv/bin/python" ]]; then
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
