#!/usr/bin/env bash
# Build the documentation site into docs/_build/html; any warning is an error.
# Extra arguments go to sphinx-build (e.g. -E to rebuild every page).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
exec .venv/bin/python -m sphinx -W --keep-going -n -b html docs docs/_build/html "$@"
