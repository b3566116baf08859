#!/usr/bin/env bash
# Sourced by run_local.sh and run_tests.sh: makes sure a Python with the
# project and its pinned dependencies is available, and exports it as PYTHON.
#
# With PYTHON already set, that interpreter is used as it is. Otherwise a
# virtual environment .venv/ at the repository root is created (first run:
# a few minutes of downloads from PyPI) and brought in line with
# pyproject.toml whenever that file changes.
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
  if [[ ! -e "$_stamp" ]]; then
    echo "== installing the project with extras [$_extras] into $_venv" >&2
    "$_venv/bin/python" -m pip install -q --upgrade pip >&2
    "$_venv/bin/python" -m pip install -q -e "${_root}[$_extras]" >&2
    rm -f "$_venv"/.installed-* && touch "$_stamp"
  fi
  export PYTHON="$_venv/bin/python"
fi
