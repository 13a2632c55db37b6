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

# recordkit._native: one module from several units, one subject each (recordkit/_native.h
# maps them); depends= rebuilds every unit when the shared header changes.
NATIVE_UNITS = ["", "_crc", "_guard", "_example", "_batch", "_runner", "_index"]

setup(
    ext_modules=[
        Extension(
            "recordkit._native",
            [f"recordkit/_native{unit}.c" for unit in NATIVE_UNITS],
            depends=["recordkit/_native.h"],
            optional=True,
            extra_compile_args=args,
        ),
        # The shuffle's keyed permutation (recordkit/reader/order.py has the NumPy twin).
        Extension(
            "recordkit._order", ["recordkit/_order.c"], optional=True, extra_compile_args=args
        ),
    ]
)
