#!/usr/bin/env bash
# A venv for MosaicML Streaming, the peer of `cache_bench.py --whole` (never the project's venv).
#
#   bash benchmarks/mds_env.sh /tmp/mds-venv [/path/to/venv/with/cpu/torch]
#
# mosaicml-streaming 0.13.0 depends on torch and torchvision: from PyPI both are CUDA builds
# (torch pulls the nvidia-* packages). Instead this venv links the CPU torch of the
# project's venv (default: the python on PATH's), installs streaming with --no-deps plus
# the dependencies its import and the S3 path need, and gives it a small stand-in for
# torchvision: streaming imports `torchvision.datasets.VisionDataset` and
# `torchvision.transforms.functional.to_tensor` at import time (streaming.vision), which the
# benchmark never calls, and PyPI's torchvision 0.28 cannot load against a CPU torch.
set -euo pipefail
venv=${1:?usage: mds_env.sh VENV [TORCH_VENV]}
torch_site=$(${2:+$2/bin/}python -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
python3.11 -m venv "$venv" 2>/dev/null || python -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for d in "$torch_site"/torch "$torch_site"/torch-*.dist-info "$torch_site"/functorch "$torch_site"/torchgen; do
    [ -e "$d" ] && ln -sfn "$d" "$site/$(basename "$d")"
done
"$venv/bin/pip" install -q "numpy<2.2" boto3 "xxhash<4" zstd python-snappy Brotli catalogue tqdm \
    filelock typing-extensions sympy networkx jinja2 fsspec "setuptools>=77" pillow "transformers<5"
"$venv/bin/pip" install -q --no-deps mosaicml-streaming==0.13.0
mkdir -p "$site/torchvision/transforms"
cat > "$site/torchvision/__init__.py" <<'PY'
"""Stand-in for the benchmark venv only: streaming.vision imports these names (see mds_env.sh)."""
PY
cat > "$site/torchvision/datasets.py" <<'PY'
class VisionDataset:  # never used by the benchmark
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("torchvision stand-in (benchmarks/mds_env.sh)")
PY
touch "$site/torchvision/transforms/__init__.py"
cat > "$site/torchvision/transforms/functional.py" <<'PY'
def to_tensor(pic):  # never used by the benchmark
    raise NotImplementedError("torchvision stand-in (benchmarks/mds_env.sh)")
PY
"$venv/bin/python" -W ignore -c 'import streaming, torch; print("streaming", streaming.__version__, "torch", torch.__version__)'
if "$venv/bin/pip" list 2>/dev/null | grep -qi nvidia; then echo "a CUDA package came in" >&2; exit 1; fi
