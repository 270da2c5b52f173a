"""Build hook: cffi_modules is only reachable through setup(); the rest lives in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["libshare/ring/_build.py:ffibuilder", "libshare/arbiter/_emergency_build.py:ffibuilder",
                        "libshare/arbiter/_engine_build.py:ffibuilder"])
