"""Build hook: the package list and cffi_modules are only reachable through setup(); the rest is in pyproject.toml.

Packages are found, not listed: every folder under ``libshare/`` with an ``__init__.py``,
plus the shaders, which live at the top level and install as ``libshare.shaders``.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["libshare", "libshare.*"]) + ["libshare.shaders"],
    cffi_modules=["libshare/ring/_build.py:ffibuilder", "libshare/arbiter/drain/_emergency_build.py:ffibuilder",
                  "libshare/arbiter/engine/_build.py:ffibuilder"],
)
