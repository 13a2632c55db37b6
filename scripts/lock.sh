#!/usr/bin/env bash
# Regenerate .ci/constraints.txt: resolve every extra and dependency group once, from
# scratch, in a throwaway venv, and pin what pip chose. Run it after changing a
# requirement in pyproject.toml; commit the result. (tests/test_constraints.py checks that
# every requirement is pinned.)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${RECORDKIT_TORCH_SPEC:-torch==2.13.0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "recordkit: resolving every extra and group in $tmp/venv (several minutes) ..." >&2
"$PYTHON" -m venv "$tmp/venv"
py="$tmp/venv/bin/python"
"$py" -m pip install --quiet --upgrade "pip>=25.1"
"$py" -m pip install --quiet "$TORCH_SPEC"
"$py" -m pip install --quiet -e ".[torch,tf-cpu,progress,s3,gcs,http,dask,ray,parquet,images,mds,hf,arrayrecord]" --group test --group frameworks --group lint --group docs
{
  echo "# Versions pinned for scripts/bootstrap.sh and CI; regenerate with bash scripts/lock.sh."
  echo "# Generated $(date -u +%Y-%m-%d) with $("$py" --version 2>&1) on $(uname -m)."
  # A local version label (+cpu) names a build, not a release: pin the release.
  "$py" -m pip freeze --exclude-editable | sed -e 's/+[a-z0-9.]*$//' | sort -f
} > .ci/constraints.txt
echo "recordkit: wrote .ci/constraints.txt ($(grep -vc '^#' .ci/constraints.txt) pins)" >&2
