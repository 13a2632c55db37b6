#!/usr/bin/env bash
# The whole test suite (set-up included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
.venv/bin/python -m ruff check .
exec .venv/bin/python -m pytest "$@"
