#!/usr/bin/env bash
# The GPU check, as one command for a borrowed GPU machine (docs/performance.md,
# "Running the GPU check"):
#
#   bash scripts/gpu_check.sh OUT              # on the GPU machine: ~7 minutes in all
#   bash scripts/gpu_check.sh --dry-run OUT    # anywhere: the same steps, stand-in device
#
# Writes under OUT (at most 8 files): env.txt, setup.log, gpu-tests.txt, prefetch.md,
# h2d.md, threads.md, summary.md, results.json.
#
# The interpreter: $PYTHON, else `python3`. The GPU machines this project borrows reach
# no package registry, and their python3 already holds a CUDA build of PyTorch (2.11
# when last seen) with numpy, pytest and pytest-timeout: that torch is used as it is
# (the lock's torch==2.13.0 is the CPU build, which would not see the GPU, and no
# registry is there to fetch a CUDA one). What recordkit needs beyond it (crc32c,
# zstandard, fsspec) comes from wheels in .whl/ when the interpreter lacks it
# (`bash scripts/gpu_check.sh --fetch-wheels` fetches them here, for that machine's
# Python 3.12), else from the registries pinned by .ci/constraints.txt where they can
# be reached. The C extension is built in place; a build that fails is reported and
# the check runs on without it (and says so).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--fetch-wheels" ]; then
  # Here, with registries: the wheels the GPU machine's Python 3.12 lacks, pinned.
  mkdir -p .whl
  grep -q '^/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
  for name in crc32c zstandard; do
    pin=$(grep -i "^${name}==" .ci/constraints.txt)
    "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pin" || exit 1
  done
  ls .whl
  exit 0
fi

dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
OUT=${1:?usage: bash scripts/gpu_check.sh [--dry-run] OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
start=$SECONDS
log() { echo "gpu_check: $* ($((SECONDS - start)) s)" | tee -a "$OUT/setup.log" >&2; }
: > "$OUT/setup.log"

# 1. What recordkit needs, in this interpreter.
missing=$("$PY" - <<'PY'
import importlib.util as u
print(" ".join(m for m in ("numpy", "torch", "crc32c", "zstandard", "fsspec", "pytest", "pytest_timeout") if u.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  log "missing in $PY: $missing"
  site="$OUT/../gpu-site"
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl >>"$OUT/setup.log" 2>&1
  else
    names=$(for m in $missing; do grep -i "^${m//_/-}==" .ci/constraints.txt; done)
    timeout 180 "$PY" -m pip install -q --target "$site" $names >>"$OUT/setup.log" 2>&1 \
      || log "could not install $missing (no registry, no .whl/): the steps that need them fail"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # recordkit from this checkout

# 2. The C extension, in place.
if timeout 240 "$PY" setup.py build_ext --inplace >>"$OUT/setup.log" 2>&1; then
  log "C extension built"
else
  log "the C extension did not build (setup.log): measuring the Python paths"
  export RECORDKIT_NO_NATIVE=1
fi

# 3. Where it runs.
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) CPUs"
  "$PY" - <<'PY'
import platform, torch
print("python:", platform.python_version())
print("torch:", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu:", torch.cuda.get_device_name())
PY
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "dry run: $dry"
} > "$OUT/env.txt" 2>&1
log "$(grep '^torch:' "$OUT/env.txt")"

# 4. The gpu-marked tests, every one, skips with their reasons.
files=$(grep -rl "mark.gpu" tests --include='*.py' | grep -v conftest)
timeout 150 "$PY" -m pytest -m gpu -rs -q -p no:cacheprovider $files > "$OUT/gpu-tests.txt" 2>&1
log "gpu tests: $(tail -n 1 "$OUT/gpu-tests.txt")"

# 5. The measurements, within what is left of 6 minutes.
budget=$((330 - (SECONDS - start)))
[ "$budget" -lt 60 ] && budget=60
flags=()
[ "$dry" = 1 ] && flags=(--dry-run)
timeout $((budget + 120)) "$PY" benchmarks/gpu_check.py "$OUT" "${flags[@]}" --budget "$budget" \
  >>"$OUT/setup.log" 2>&1
status=$?
log "measurements: exit $status; summary in $OUT/summary.md"
[ -f "$OUT/summary.md" ] && cat "$OUT/summary.md"
exit $status
