#!/usr/bin/env bash
# The optional NVIDIA DALI test (tests/compat/test_dali.py), in a throwaway venv: DALI is a
# ~425 MB wheel and never enters the project's .venv or the default CI. It runs on a
# machine without a GPU (DALI's CPU pipelines take device_id=None).
#   bash scripts/test_dali.sh [VENV [PYTEST ARGS...]]    (default VENV: /tmp/recordkit-dali)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-/tmp/recordkit-dali}
[ $# -gt 0 ] && shift
python=${PYTHON:-python3}
echo "== venv $venv"
"$python" -m venv "$venv"
echo "== pip (>= 25.1 reads dependency groups)"
"$venv/bin/pip" install --quiet --upgrade pip
echo "== the dali group (nvidia-dali-cuda120, pytest, Pillow) and recordkit's own dependencies"
"$venv/bin/pip" install --quiet --group dali numpy crc32c zstandard fsspec
echo "== recordkit (--no-deps: nothing else of the project's extras)"
"$venv/bin/pip" install --quiet --no-deps .
echo "== tests/compat/test_dali.py"
exec "$venv/bin/python" -m pytest tests/compat/test_dali.py -v -p no:cacheprovider "$@"
