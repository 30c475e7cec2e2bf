"""The one thing pyproject.toml cannot declare without setuptools' experimental-feature warning:
the compiled hot loops, plain C against the Python headers: capture's wal2json parser
(loader/capture/_wal2json.c) and the load's typing of date, timestamp and numeric texts
(loader/load/_typing.c). Both are optional: where they do not build (no C compiler), the install
goes on and capture reads wal2json rows with Arrow's JSON reader instead (the same records, about
3x the CPU), the load types dates, timestamps and numerics with RE2 and Arrow's cast (the same
values, about 5-10x the CPU for those columns)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "loader.capture._wal2json",
            sources=["loader/capture/_wal2json.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        ),
        Extension(
            "loader.load._typing",
            sources=["loader/load/_typing.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        ),
    ]
)
