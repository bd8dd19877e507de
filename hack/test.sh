#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy --strict) and pytest on parallel workers. Extra args go
# to pytest (`-n 0` runs it in one process; HAMI_TEST_WORKERS=N sets the number of workers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
. .venv/bin/activate
# Python may cache bytecode here even where the environment says not to: every process of the suite
# (pytest's workers, each local cluster's daemons) would otherwise compile the same modules again, and
# each worker would rewrite every test module's asserts again.
unset PYTHONDONTWRITEBYTECODE

echo "== ruff"
ruff check .
ruff format --check .

# mypy checks beside pytest (it takes one core for 20-30 s from a clean clone) and reports at the end.
mypy_log=$(mktemp)
mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT

echo "== pytest"
# One collection in this process first: it writes the bytecode of every module with its asserts
# rewritten, which the workers then load instead of each rewriting them again (11 s each from a clone).
python -m pytest --collect-only -q -n 0 "$@" >/dev/null 2>&1 || true  # errors: the run below shows them
# Three workers per core, at most 8: most end-to-end tests wait on their clusters more than they compute
# (on 2 cores: 6 workers 2 min 31 s, 4 workers 2 min 58 s, 8 workers 2 min 58 s and 20% more CPU), and
# each worker's local clusters take inotify instances, 128 per user by default (6 workers took 51).
cores=$(nproc)
workers=${HAMI_TEST_WORKERS:-$((3 * cores < 8 ? 3 * cores : 8))}
pytest_status=0
python -m pytest -n "$workers" --dist loadgroup "$@" || pytest_status=$?

echo "== mypy --strict"
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
cat "$mypy_log"
[ "$pytest_status" = 0 ] || exit "$pytest_status"
exit "$mypy_status"
