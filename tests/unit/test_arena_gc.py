"""A lease that dies in a reference cycle (an exception's traceback holding the frame that held
it) is collected without touching freed memory (NOTE [ A lease's buffer survives garbage
collection ] in pyx/_arena.pyx). Run in a subprocess: the failure mode is a segfault."""

import subprocess
import sys
import textwrap


def test_leases_in_garbage_cycles_are_collected_safely():
    code = textwrap.dedent("""
        import gc
        import numpy as np
        from loaderlib.arena import BatchArena
        from loaderlib._engines.processes import _ShmBlock

        def garbage(allocator):
            arena = BatchArena(2, allocator=allocator)
            lease = arena.acquire_bytes(1 << 16)
            np.frombuffer(lease, np.uint8)[:4] = 7
            junk = {"arena": arena, "lease": lease, "block": lease.source}
            junk["self"] = junk

        gc.disable()
        for _ in range(3):
            garbage(_ShmBlock)   # shared-memory slots: a memoryview over an mmap
            garbage(None)        # the default aligned buffers
        print("unreachable:", gc.collect() > 0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unreachable: True" in out.stdout
    assert "Exception ignored" not in out.stderr, out.stderr[-2000:]
