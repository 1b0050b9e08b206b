"""Builds the two C extensions; everything else is in pyproject.toml.

Both are optional: without a C compiler the install goes on and the same bytes come from slower
code, Pillow's own resize for `seedance_tasks.preprocess._resample` and numpy for
`seedance_tasks.checkpoint._planes` (byte planes of checkpoint chunks)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("seedance_tasks.preprocess._resample", ["seedance_tasks/preprocess/_resample.c"],
                             extra_compile_args=["-O3"], optional=True),
                   Extension("seedance_tasks.checkpoint._planes", ["seedance_tasks/checkpoint/_planes.c"],
                             extra_compile_args=["-O3"], optional=True)])
