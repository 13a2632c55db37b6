"""Builds the optional C extension; all project metadata lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and recordkit
uses the pure Python/NumPy decoder (``recordkit/reader/_fallback.py``) instead.

``recordkit/native/tfop.cc`` (a TensorFlow op for ``recordkit.tf``'s native path) is built
too when TensorFlow is importable here, against that TensorFlow (its
``tf.sysconfig`` flags): a build with pip's default isolation has no TensorFlow and
skips it, ``pip install --no-build-isolation`` (TensorFlow installed first) builds
it, ``RECORDKIT_NO_TFOP=1`` skips it. Without it, or under another TensorFlow
version, ``recordkit.tf`` reads the same values with two more copies of each
``Bytes()`` value (``recordkit/tf/native.py``).
"""

import os
import sys

from setuptools import Extension, find_packages, setup

if sys.platform == "win32":
    args = ["/O2"]
else:
    args = ["-O3", "-Wall", "-Wextra", "-fvisibility=hidden"]

# recordkit.native._ext: one module from several units, one subject each, all in
# recordkit/native/ (recordkit/native/recordkit.h maps them); depends= rebuilds every
# unit when a shared header (recordkit.h, record.h) changes.
NATIVE = "recordkit/native"
# order: the shuffle's permutation (recordkit/reader/order.py is its NumPy twin)
NATIVE_UNITS = ["module", "crc", "guard", "example", "batch", "spans", "lists", "task", "runner"]
NATIVE_UNITS += ["index", "filemap", "order"]


def _tf_op() -> list[Extension]:
    """recordkit.native._tfop, for the TensorFlow importable here (none: nothing to build)."""
    if sys.platform == "win32" or os.environ.get("RECORDKIT_NO_TFOP", "") not in ("", "0"):
        return []
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except Exception:  # not installed, or broken: recordkit.tf (if used) falls back
        return []
    version = tf.__version__
    return [
        Extension(
            "recordkit.native._tfop",
            [f"{NATIVE}/tfop.cc"],
            optional=True,
            language="c++",
            extra_compile_args=[
                *tf.sysconfig.get_compile_flags(),
                "-O2",
                "-fvisibility=hidden",
                "-Wno-deprecated-declarations",
                f'-DRECORDKIT_TF_VERSION="{version}"',
            ],
            extra_link_args=tf.sysconfig.get_link_flags(),
        )
    ]


# The top-level converters/ folder installs as recordkit.converters (never as a
# top-level "converters", a name PyPI already has and a user's converters.py would
# shadow); an editable install maps the same name to the same folder.
PACKAGES = [*find_packages(include=["recordkit", "recordkit.*"]), "recordkit.converters"]

setup(
    packages=PACKAGES,
    package_dir={"recordkit.converters": "converters"},
    ext_modules=[
        Extension(
            "recordkit.native._ext",
            [f"{NATIVE}/{unit}.c" for unit in NATIVE_UNITS],
            depends=[f"{NATIVE}/recordkit.h", f"{NATIVE}/record.h"],
            optional=True,
            extra_compile_args=args,
        ),
        *_tf_op(),
    ],
)
