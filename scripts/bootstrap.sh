#!/usr/bin/env bash
# Create .venv and install recordkit into it, one line per step.
#
#   bash scripts/bootstrap.sh demo   # recordkit, its pinned CPU torch, tensorflow-cpu,
#                                    # and what the examples need (scripts/demo.sh)
#   bash scripts/bootstrap.sh test   # the demo's set plus every extra and the test,
#                                    # lint and docs groups (scripts/test.sh, CI)
#
# Every install is resolved against .ci/constraints.txt, the versions pinned by
# scripts/lock.sh, so pip never walks back through releases (an unpinned resolve of the
# test group took ~5 minutes of backtracking through aiobotocore/s3fs releases).
# Idempotent: re-running is a no-op unless pyproject.toml, the constraints, the C
# sources (recordkit/native/) or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."

level=${1:-test}
case "$level" in
  demo | test) ;;
  *) echo "usage: bash scripts/bootstrap.sh [demo|test]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
VENV=${RECORDKIT_VENV:-.venv}
# torch is pinned to the CPU build available on our machines: a bare or open
# requirement can pull a multi-GB CUDA build instead.
TORCH_SPEC=${RECORDKIT_TORCH_SPEC:-torch==2.13.0}
CONSTRAINTS=.ci/constraints.txt

want=$(cat pyproject.toml setup.py recordkit/native/*.c recordkit/native/*.h recordkit/native/*.cc "$CONSTRAINTS" scripts/bootstrap.sh \
  | sha256sum | cut -d' ' -f1)
stamp_ok() { [ -f "$VENV/.recordkit-$1" ] && [ "$(cat "$VENV/.recordkit-$1")" = "$want" ]; }
if stamp_ok "$level" || { [ "$level" = demo ] && stamp_ok test; }; then
  exit 0
fi

say() { echo "recordkit: $*" >&2; }
pip_install() {  # silent on success; on failure pip's own output says why
  local log
  log=$(mktemp)
  if ! "$VENV/bin/python" -m pip install --quiet --constraint "$CONSTRAINTS" "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    say "install failed: pip install $*"
    exit 1
  fi
  rm -f "$log"
}

start=$SECONDS
if [ ! -x "$VENV/bin/python" ]; then
  say "[1/4] creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
else
  say "[1/4] updating $VENV"
fi
say "[2/4] pip"
pip_install --upgrade "pip>=25.1"
say "[3/4] $TORCH_SPEC (the CPU build)"
pip_install "$TORCH_SPEC"
if [ "$level" = demo ]; then
  say "[4/4] recordkit (editable) with tensorflow-cpu, tqdm and Pillow (the examples' images)"
  pip_install -e ".[torch,tf-cpu,progress,images]"
else
  say "[4/4] recordkit (editable) with every extra, and the test, lint and docs tools"
  pip_install -e ".[torch,tf-cpu,progress,s3,http,dask,ray,parquet,images,mds,hf,arrayrecord]" \
    --group test --group frameworks --group lint --group docs
fi
echo "$want" > "$VENV/.recordkit-$level"
say "$level environment ready in $VENV ($((SECONDS - start)) s)"
