"""After :func:`isojax.host.reuse_freed_memory`, a large block freed and requested again costs no page faults
(counted by the kernel: ``getrusage``); without it, every request faults each of its pages in again."""

import subprocess
import sys

import pytest

PROGRAM = """
import ctypes, resource, sys
if sys.argv[1] == "reuse":
    from isojax.host import reuse_freed_memory
    assert reuse_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 2**28  # 256 MiB, above glibc's largest mmap threshold (numpy would ask for huge pages itself)

def touch():
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    libc.free(block)

touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_block_is_reused_without_page_faults():
    def faults(mode):
        run = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
        return int(run.stdout.split()[-1])

    pages = 3 * 2**28 // 4096  # the three requests' 4 KiB pages
    assert faults("plain") > pages // 2  # each request mapped anew
    assert faults("reuse") < pages // 100
