#!/usr/bin/env bash
# Prepare a development environment from a clean clone. Idempotent and quick when nothing changed.
#
#   hack/setup.sh          what the tests need (hack/test.sh): a virtualenv in .venv with the package
#                          (editable) and its test tools, checkov in .venv-scan, kubectl and Prometheus
#   hack/setup.sh --demo   what the demo needs (hack/demo.sh): .venv with the package alone
set -euo pipefail
cd "$(dirname "$0")/.."

mode=test
case "${1:-}" in
  --demo) mode=demo ;;
  "") ;;
  *) echo "setup: unknown argument '$1' (use --demo or nothing)" >&2; exit 2 ;;
esac

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

pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }

# One stamp per set of packages: .installed-<hash> the package with its test tools (which include all
# the demo needs), .installed-run-<hash> the package alone.
hash=$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
stamp=".venv/.installed-$hash"
run_stamp=".venv/.installed-run-$hash"
if [ "$mode" = demo ]; then
  if [ ! -f "$stamp" ] && [ ! -f "$run_stamp" ]; then
    echo "setup: installing hami-py and its runtime dependencies into .venv (first run only; about 20 s" \
         "on 2 cores; the test tools come with hack/test.sh)"
    # --no-compile: pip would compile every module of every package (the kubernetes client alone has
    # ~1,000), 15-20 s on 2 cores; the demo's processes compile the few hundred they import, once.
    pip_install --no-compile -e .
    rm -f .venv/.installed-run-*
    touch "$run_stamp"
  fi
  exit 0
fi

if [ ! -f "$stamp" ]; then
  echo "setup: installing hami-py and its test tools into .venv"
  pip_install --upgrade pip
  pip_install -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# checkov (tests/unit/test_manifest_scan.py) in a virtualenv of its own: its dependencies conflict with
# ours (hack/scan-requirements.txt says which).
scan_stamp=".venv-scan/.installed-$(sha256sum hack/scan-requirements.txt | cut -c1-16)"
if [ ! -f "$scan_stamp" ]; then
  echo "setup: installing checkov into .venv-scan (for the manifest scan test)"
  [ -x .venv-scan/bin/python ] || "$py" -m venv .venv-scan
  .venv-scan/bin/python -m pip install --quiet --disable-pip-version-check -r hack/scan-requirements.txt
  rm -f .venv-scan/.installed-*
  touch "$scan_stamp"
fi

# kubectl (the kubectl tests) and Prometheus with promtool (the alert rules' tests and the dashboard's
# test against a running Prometheus), from Debian's packages when missing; without them those tests skip
# (CI, .ci/run, requires them).
missing=()
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]} (Debian packages)"
    apt-get update -qq >/dev/null
    # --no-install-recommends: the prometheus package recommends node-exporter and its collectors.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # The package's maintainer scripts may start Prometheus as a service (with systemd, or an init
    # system that lets invoke-rc.d start it): the tests run their own, so stop the one just installed.
    if [[ " ${missing[*]} " == *" prometheus "* ]]; then
      if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
      elif [ -x /etc/init.d/prometheus ]; then
        /etc/init.d/prometheus stop >/dev/null 2>&1 || true
      fi
    fi
  else
    echo "setup: ${missing[*]} not found; the tests that need them will be skipped" \
         "(install them, or run this as root on Debian/Ubuntu)" >&2
  fi
fi
