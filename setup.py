"""The one thing pyproject.toml cannot declare without setuptools' experimental-feature warning:
capture's compiled wal2json parser (loader/capture/_wal2json.c, plain C against the Python headers).
It is optional: where it does not build (no C compiler), the install goes on and capture reads
wal2json rows with Arrow's JSON reader instead (the same records, about 3x the CPU)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "loader.capture._wal2json",
            sources=["loader/capture/_wal2json.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        )
    ]
)
