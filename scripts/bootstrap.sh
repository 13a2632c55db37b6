#!/usr/bin/env bash
# Create .venv (once) and install recordkit with everything the demo and tests need.
# Idempotent: re-running is a no-op unless pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${RECORDKIT_VENV:-.venv}
# torch is pinned to the CPU build available on our machines: a bare or open
# requirement can pull a multi-GB CUDA build instead.
TORCH_SPEC=${RECORDKIT_TORCH_SPEC:-torch==2.13.0}

stamp="$VENV/.recordkit-bootstrap"
want=$(cat pyproject.toml setup.py recordkit/*.c scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "recordkit: setting up $VENV (first run takes a few minutes) ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
py="$VENV/bin/python"
"$py" -m pip install --quiet --upgrade "pip>=25.1"
"$py" -m pip install --quiet "$TORCH_SPEC"
"$py" -m pip install --quiet -e ".[torch,tf-cpu,progress,s3,http,dask,parquet]" --group test --group lint --group docs
echo "$want" > "$stamp"
echo "recordkit: environment ready in $VENV" >&2
