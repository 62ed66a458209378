"""
L{edgegw.tap.tune_malloc}: glibc keeps the heap's free top between requests and serves
blocks below the mapping threshold from the heap. Checked in a fresh interpreter, whose
heap no earlier test has shaped, through glibc's own account of it (C{mallinfo2}).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import REPO_ROOT

_PROBE = """
import ctypes, json, sys
from edgegw.tap import tune_malloc

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    ).split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
tuned = tune_malloc() if sys.argv[1] == "tune" else None
before = libc.mallinfo2().hblks
large = [b"x" * 512 * 1024 for _ in range(2)]
mapped = libc.mallinfo2().hblks - before
del large
# A few 64 KiB responses' worth of blocks, all freed: the heap's top is then free.
blocks = [b"x" * 65536 for _ in range(40)]
del blocks
print(json.dumps({"tuned": tuned, "mapped": mapped, "kept": libc.mallinfo2().keepcost}))
"""


def _probe(mode: str, **environ: str) -> dict[str, object]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    env.update(PYTHONPATH=str(REPO_ROOT), **environ)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        env=env,
        cwd=str(REPO_ROOT),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


class TuneMallocTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
            raise self.skipTest("glibc only")

    def test_heap_top_kept_and_blocks_below_a_mebibyte_from_the_heap(self) -> None:
        tuned = _probe("tune")
        self.assertEqual(tuned["tuned"], True)
        # 40 freed blocks of 64 KiB (2.5 MiB) stay at the top of the heap.
        kept = tuned["kept"]
        assert isinstance(kept, int)
        self.assertGreaterEqual(kept, 2 * 1024 * 1024)
        self.assertEqual(tuned["mapped"], 0)

    def test_untuned_glibc_trims_and_maps(self) -> None:
        # What the tuning is for: without it, glibc maps the 512 KiB blocks and gives
        # the freed top back (the probe would not tell the two apart otherwise).
        untuned = _probe("leave")
        kept = untuned["kept"]
        assert isinstance(kept, int)
        self.assertLess(kept, 2 * 1024 * 1024)
        self.assertEqual(untuned["mapped"], 2)

    def test_an_operators_setting_is_left_in_charge(self) -> None:
        tuned = _probe("tune", MALLOC_TRIM_THRESHOLD_="131072")
        self.assertEqual(tuned["tuned"], False)
        kept = tuned["kept"]
        assert isinstance(kept, int)
        self.assertLess(kept, 2 * 1024 * 1024)
