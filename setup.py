"""The package list, found rather than written down, so a new subpackage is never left out.

The repository root is the package `fleetrl` (`package-dir` in pyproject.toml), so every
folder below it with an __init__.py is `fleetrl.<folder>`. This file sits in that root too,
and is kept out of the package. Everything else about the package is in pyproject.toml.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        return [module for module in super().find_package_modules(package, package_dir)
                if (module[0], module[1]) != ("fleetrl", "setup")]


setup(packages=["fleetrl", *(f"fleetrl.{name}" for name in find_packages(".", exclude=["tests", "tests.*"]))],
      cmdclass={"build_py": BuildPy})
