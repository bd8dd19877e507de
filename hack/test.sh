#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy --strict), then pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
. .venv/bin/activate
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy --strict"
mypy
echo "== pytest"
python -m pytest "$@"
