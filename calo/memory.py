"""Keep the memory a search frees for its next allocations (glibc's malloc only).

Scoring a population allocates tensors of a few MiB per layer. glibc serves blocks above its
mmap threshold with fresh mappings and returns freed heap tops to the system, so every call
faults those pages in again: about half of the forward pass on a population of 512. Raising
both thresholds keeps the pages mapped. Other allocators are left as they are.
"""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20   # above any one tensor of a population's forward
TRIM_THRESHOLD = 512 << 20  # freed heap kept before any is returned to the system

_done = False


def keep_freed_memory() -> bool:
    """Serve blocks up to MMAP_THRESHOLD from the heap and keep up to TRIM_THRESHOLD of it freed;
    once per process. False where the C library has no mallopt or refuses."""
    global _done
    if _done:
        return True
    try:
        # The process's own symbols: no library search (find_library runs ldconfig).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    _done = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
             and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    return _done
