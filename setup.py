"""Builds the one C extension (`seedance_tasks.preprocess._resample`); everything else is in pyproject.toml.

The extension is optional: without a C compiler the install goes on and preprocessing uses
Pillow's own resize (the same bytes, slower)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("seedance_tasks.preprocess._resample", ["seedance_tasks/preprocess/_resample.c"],
                             extra_compile_args=["-O3"], optional=True)])
