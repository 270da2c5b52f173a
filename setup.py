"""Build hook: the package list, cffi_modules and the Vulkan driver are only reachable through setup(); the
rest is in pyproject.toml.

Packages are found, not listed: every folder under ``libshare/`` with an ``__init__.py``,
plus the shaders, which live at the top level and install as ``libshare.shaders``. ``build_ext``
also compiles the Vulkan driver, ``libshare/icd/libshare_icd.so``, a plain shared library beside
the Python modules (in place for an editable install), and writes its manifest
(libshare/icd/_build.py).
"""

import importlib.util
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class BuildWithDriver(build_ext):
    """build_ext, then the Vulkan driver (into the source tree in place, else into build_lib)."""

    def run(self):
        super().run()
        spec = importlib.util.spec_from_file_location("libshare_icd_build", ROOT / "libshare" / "icd" / "_build.py")
        driver = importlib.util.module_from_spec(spec)  # by its path: libshare is not importable here
        spec.loader.exec_module(driver)
        driver.build((ROOT if self.inplace else Path(self.build_lib)) / "libshare" / "icd")


setup(
    packages=find_packages(include=["libshare", "libshare.*"]) + ["libshare.shaders"],
    cffi_modules=["libshare/ring/_build.py:ffibuilder", "libshare/arbiter/drain/_emergency_build.py:ffibuilder",
                  "libshare/arbiter/engine/_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildWithDriver},
)
