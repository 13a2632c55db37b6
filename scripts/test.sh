#!/usr/bin/env bash
# The whole test suite (set-up included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
bash scripts/beam_env.sh  # Apache Beam's own venv for tests/engines (~25 s once; a no-op after)
.venv/bin/python -m ruff check .
exec .venv/bin/python -m pytest "$@"
