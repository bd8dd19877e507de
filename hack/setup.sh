#!/usr/bin/env bash
# Prepare a development environment from a clean clone: a virtualenv in .venv with the package
# (editable) and its test tools, and kubectl. Idempotent and quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-}
if [ -z "$py" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      py=$candidate; break
    fi
  done
fi
[ -n "$py" ] || { echo "setup: Python >= 3.11 is required (set PYTHON=...)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $py"
  "$py" -m venv .venv || {
    echo "setup: '$py -m venv' failed; on Debian/Ubuntu install python3-venv" >&2; exit 1; }
fi

stamp=".venv/.installed-$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing hami-py and its test tools into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# checkov (tests/unit/test_manifest_scan.py) in a virtualenv of its own: its dependencies conflict with
# ours (hack/scan-requirements.txt says which).
scan_stamp=".venv-scan/.installed-$(sha256sum hack/scan-requirements.txt | cut -c1-16)"
if [ ! -f "$scan_stamp" ]; then
  echo "setup: installing checkov into .venv-scan"
  [ -x .venv-scan/bin/python ] || "$py" -m venv .venv-scan
  .venv-scan/bin/python -m pip install --quiet --disable-pip-version-check -r hack/scan-requirements.txt
  rm -f .venv-scan/.installed-*
  touch "$scan_stamp"
fi

if ! command -v kubectl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing kubectl (Debian package kubernetes-client)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
  else
    echo "setup: kubectl not found; kubectl tests will be skipped (install kubectl to run them)" >&2
  fi
fi
