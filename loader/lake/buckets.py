"""Iceberg's ``bucket[n]`` transform for whole Arrow/numpy columns (the merge's driver paths file
rows under the bucket Spark's ``bucket`` function gives them; tests/merge/test_engines.py holds
the two equal for every key type and width)."""

from __future__ import annotations

from typing import Any


def bucket_ints(values: Any, n: int) -> Any:
    """Iceberg's ``bucket[n]`` of integer values (int and long hash the same: the value as 8 bytes
    little-endian through murmur3_x86_32, seed 0), for a whole numpy/Arrow column at once."""
    import numpy as np

    return (_murmur_ints(values) % np.uint32(n)).astype(np.int32)


def key_hashes(keys: Any) -> Any:
    """Iceberg's bucket hash of each key of an Arrow column (integers, whole column at once; text,
    murmur3 of its UTF-8 one value at a time) before the modulo: ``bucket[n]`` is this ``% n``."""
    import mmh3
    import numpy as np
    import pyarrow as pa

    if pa.types.is_integer(keys.type):
        return _murmur_ints(keys.to_numpy(zero_copy_only=False))
    return np.fromiter(
        (mmh3.hash(v.encode("utf-8")) & 0x7FFFFFFF for v in keys.to_pylist()), dtype=np.uint32, count=len(keys)
    )


def _murmur_ints(values: Any) -> Any:
    """murmur3_x86_32 (seed 0) of each integer as 8 bytes little-endian, masked non-negative."""
    import numpy as np

    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    c1, c2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)

    def rotl(x: Any, r: int) -> Any:
        return (x << np.uint32(r)) | (x >> np.uint32(32 - r))

    h = np.zeros(len(v), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for block in ((v & np.uint64(0xFFFFFFFF)).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)):
            k = rotl(block * c1, 15) * c2
            h = rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h & np.uint32(0x7FFFFFFF)
