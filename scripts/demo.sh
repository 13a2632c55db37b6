#!/usr/bin/env bash
# The main job on generated data: write a dataset, verify it, read it back in
# PyTorch and TensorFlow, and say what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh demo
exec .venv/bin/python examples/quickstart.py "$@"
