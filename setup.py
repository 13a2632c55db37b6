"""Builds the optional C extension; all project metadata lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and recordkit
uses the pure Python/NumPy decoder (``recordkit/reader/_fallback.py``) instead.
"""

import sys

from setuptools import Extension, setup

if sys.platform == "win32":
    args = ["/O2"]
else:
    args = ["-O3", "-Wall", "-Wextra", "-fvisibility=hidden"]

setup(
    ext_modules=[
        Extension(
            "recordkit._native", ["recordkit/_native.c"], optional=True, extra_compile_args=args
        ),
        # The shuffle's keyed permutation (recordkit/reader/order.py has the NumPy twin).
        Extension(
            "recordkit._order", ["recordkit/_order.c"], optional=True, extra_compile_args=args
        ),
        # The .idx text parsed and checked in one pass (recordkit/format/shard_index.py
        # falls back to NumPy's parse_index without it).
        Extension(
            "recordkit._index", ["recordkit/_index.c"], optional=True, extra_compile_args=args
        ),
    ]
)
