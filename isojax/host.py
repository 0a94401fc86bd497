"""Settings of the host process that XLA's CPU runtime runs fastest under.

XLA on CPU allocates each execution's temporaries anew (a train step of all-MiniLM-L6-v2 shape on 32 x 128 tokens:
over a gigabyte in blocks larger than glibc's 32 MiB mmap limit). glibc serves such requests with fresh ``mmap``
regions and unmaps them on free, so every step faults in every page again: 370,000 page faults and 0.7 s of kernel
time a step on a 2-core VM, where PyTorch, whose tensors are smaller, reuses its heap. :func:`reuse_freed_memory`
makes glibc keep freed memory and hand it out again. ``isojax``'s command line calls it first; a program of one's own
calls it before JAX starts, or sets ``MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``
(``docs/design/cpu-train-step.md`` has the measurements).
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc's malloc.h
_SETTINGS = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))


def reuse_freed_memory() -> bool:
    """Make glibc's ``malloc`` serve every request from one heap that it never trims (``mallopt``: one arena, no
    ``mmap``-ed blocks, trim threshold 2 GiB): freed memory is reused without page faults, and the process keeps its
    peak resident size. Affects the threads and arenas created after the call.

    Returns:
      Whether the settings took: False off Linux or without glibc's ``mallopt``.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(option, value) == 1 for option, value in _SETTINGS)


__all__ = ["reuse_freed_memory"]
