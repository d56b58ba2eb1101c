"""Build hook for the cffi extension (everything else lives in pyproject.toml)."""

import cffi  # noqa: F401  -- fail loudly if the build requirement is missing
from setuptools import setup

setup(cffi_modules=["csrc/build_ffi.py:ffibuilder"])
