"""Benchmarks: ``python -m bench`` (``make bench``) runs every ``bench/capture_*.py`` and ``bench/merge_*.py``.

Each module has a ``run()`` that prints its figures; speed is measured here, never asserted in tests.
"""
