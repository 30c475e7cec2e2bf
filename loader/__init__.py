"""PostgreSQL change history into Iceberg: capture (wal2json) -> landing -> history -> current."""

import os

__version__ = "0.1.0"

# Arrow's memory pool: the C library's allocator unless the environment chose one. pyarrow's
# default here (mimalloc) faulted in fresh pages for every large batch the loader builds and
# dropped: `loader load` of 1M changes spent 1.4 s in the kernel against 0.7 s, 6.4 against 5.4 s
# in all, and capture's peak RSS was 300 MB against 205 (README, Performance). Read once, when
# pyarrow first allocates, so this must run before that (importing any loader module does).
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

# glibc's malloc serves a block of 128 KiB or more (its threshold grows with the blocks freed,
# up to 32 MiB) by mmap and gives it back on free, and trims its heap's top above 128 KiB free: the
# load's columns (megabytes each, built and dropped group after group) were fresh pages every
# time, 45,000 page faults and 0.11 of 0.67 CPU-s per 1M changes. Blocks up to MALLOC_MMAP_BYTES
# come from the heap and up to MALLOC_TRIM_BYTES of free heap is kept for the next group: 45,000 ->
# under 7,000 faults, 0.11 -> 0.05 s of system time (docs/performance-log.md). The peak is
# what it was (the same blocks, held at once); what the process keeps after it, up to the trim
# bound, is reused rather than returned. A process whose environment sets glibc's own
# MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ keeps its choice.
MALLOC_MMAP_BYTES = 256 << 20
MALLOC_TRIM_BYTES = 512 << 20


def _tune_malloc() -> None:
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has it
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    # An older glibc may refuse a threshold above 32 MiB on 64-bit (its documented maximum), and
    # setting the trim threshold alone would fix the mmap threshold at 128 KiB (no more growing).
    if not mallopt(m_mmap_threshold, MALLOC_MMAP_BYTES) and not mallopt(m_mmap_threshold, 32 << 20):
        return
    mallopt(m_trim_threshold, MALLOC_TRIM_BYTES)


_tune_malloc()
