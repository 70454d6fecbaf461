#!/usr/bin/env bash
# test_all.py (the algorithm's tests, mpirun ones included) under the other Pythons users run,
# each in a venv of its own made from requirements.txt (.venv-3.12, .venv-3.13). An interpreter
# is python3.X on PATH, or pyenv's copy where PATH has only pyenv's shim for it (a shim whose
# version is not selected fails); one this machine lacks is one line, not a failure.
#   bash tests/other-pythons.sh [VERSIONS...]     (default: 3.12 3.13)
# Test: this is one (.ci/run runs it last).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
for version in "${@:-3.12 3.13}"; do
  for v in $version; do
    python=""
    for candidate in "$(command -v "python$v" || true)" \
                     "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v"*/bin/"python$v"; do
      if [ -x "$candidate" ] && "$candidate" -c "" 2>/dev/null; then
        python=$candidate
        break
      fi
    done
    if [ -z "$python" ]; then
      echo "tests/other-pythons.sh: no Python $v on this machine: test_all.py not run under it"
      continue
    fi
    "$python" -m venv ".venv-$v"
    ".venv-$v/bin/pip" install -q -r requirements.txt
    echo "tests/other-pythons.sh: $(".venv-$v/bin/python" --version)"
    ".venv-$v/bin/python" -m pytest -q -p no:cacheprovider test_all.py
  done
done
