"""Builds gradsync's one C extension (the shared-buffer collectives of one host) with the
machine's compiler; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gradsync.runtime.transport.shm._native",
                             sources=["src/gradsync/runtime/transport/shm/native.c"],
                             extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function"])])
