#!/usr/bin/env bash
# Apache Beam's own environment for tests/engines (Beam writes TFRecords that recordkit
# reads, and reads recordkit's shards). Beam stays out of the project's .venv:
# apache-beam 2.77 needs the [tfrecord] extra to write TFRecords and pins pillow<13,
# which the project's lock (pillow 13) does not allow. No torch, no TensorFlow here:
# recordkit imports without them, and its codec parses Examples inside the pipeline.
#
#   bash scripts/beam_env.sh            # create or update .beam-venv (git-ignored)
#   bash scripts/beam_env.sh --freeze   # resolve afresh, rewrite .ci/beam-constraints.txt
#
# RECORDKIT_BEAM_VENV overrides the venv's path (the tests read the same variable).
# Every install is resolved against .ci/beam-constraints.txt. Idempotent: a rerun is a
# no-op unless this script, the constraints, pyproject.toml, setup.py or the C sources
# changed. The venv imports recordkit from this checkout, so it always runs its code.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${RECORDKIT_BEAM_VENV:-.beam-venv}
CONSTRAINTS=.ci/beam-constraints.txt
BEAM=("apache-beam[tfrecord]==2.77.0" "pillow<13" numpy)
freeze=0
case "${1:-}" in
  "") ;;
  --freeze) freeze=1 ;;
  *) echo "usage: bash scripts/beam_env.sh [--freeze]" >&2; exit 2 ;;
esac

stamp() {  # what the venv was built from (the constraints only once they exist)
  local files=(scripts/beam_env.sh pyproject.toml setup.py recordkit/native/*.c recordkit/native/*.h recordkit/native/*.cc)
  [ -f "$CONSTRAINTS" ] && files+=("$CONSTRAINTS")
  cat "${files[@]}" | sha256sum | cut -d' ' -f1
}
want=$(stamp)
if [ "$freeze" = 0 ] && [ -f "$VENV/.recordkit-beam" ] && [ "$(cat "$VENV/.recordkit-beam")" = "$want" ]; then
  exit 0
fi

say() { echo "beam_env: $*" >&2; }
pip_install() {  # silent on success; on failure pip's own output says why
  local log
  log=$(mktemp)
  if ! "$VENV/bin/python" -m pip install --quiet "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    say "install failed: pip install $*"
    exit 1
  fi
  rm -f "$log"
}

start=$SECONDS
constrain=()
if [ "$freeze" = 1 ]; then
  say "--freeze: a fresh $VENV, resolved without $CONSTRAINTS"
  rm -rf "$VENV"
elif [ -f "$CONSTRAINTS" ]; then
  constrain=(--constraint "$CONSTRAINTS")
fi
if [ ! -x "$VENV/bin/python" ]; then
  say "[1/4] creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
else
  say "[1/4] updating $VENV"
fi
say "[2/4] pip"
pip_install "${constrain[@]}" --upgrade "pip>=25.1"
say "[3/4] ${BEAM[*]}"
pip_install "${constrain[@]}" "${BEAM[@]}"
say "[4/4] recordkit from this checkout: its dependencies, and a .pth naming the checkout"
# Not `pip install -e .`: that rebuilds the C extension into recordkit/ in place,
# rewriting the .so files a running test process of the project's .venv has mapped.
# The .pth imports the checkout as it is (its extension, when built for this Python;
# the pure Python decoder otherwise), so the venv never runs stale code.
pip_install "${constrain[@]}" numpy crc32c zstandard fsspec  # pyproject's dependencies
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
pwd >"$site/recordkit-checkout.pth"
"$VENV/bin/python" -c 'import apache_beam, recordkit.codec' \
  || { say "recordkit or Beam does not import in $VENV"; exit 1; }
if [ "$freeze" = 1 ]; then
  {
    echo "# The Beam venv's versions (scripts/beam_env.sh --freeze, $("$VENV/bin/python" --version 2>&1))."
    "$VENV/bin/python" -m pip freeze --exclude-editable --all | grep -v '^recordkit'
  } >"$CONSTRAINTS"
  say "wrote $CONSTRAINTS ($(grep -vc '^#' "$CONSTRAINTS") pins)"
  want=$(stamp)
fi
echo "$want" >"$VENV/.recordkit-beam"
say "Beam environment ready in $VENV ($((SECONDS - start)) s)"
