"""The serve process's allocator setting: after a large block was freed, later blocks of a few MiB are still
given back to the system when freed (glibc's dynamic threshold would have kept them in an arena)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import sys
    from omnistage.entrypoints.openai.allocator import return_large_blocks_to_the_system
    if sys.argv[1] == "set" and not return_large_blocks_to_the_system():
        print("no-glibc"); raise SystemExit
    def rss():
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) // 1024
    big = bytearray(30 << 20); del big  # a large body freed: glibc raises its threshold to 30 MiB
    base = rss()
    blocks, kept = [], []
    for _ in range(50):  # 200 MiB in 4 MiB blocks, touched, each followed by a small block that stays
        blocks.append(bytearray(4 << 20))
        blocks[-1][::4096] = b"x" * len(blocks[-1][::4096])
        kept.append(bytearray(64 << 10))
    del blocks
    print(rss() - base)
""")


def _kept_mib(mode: str) -> str:
    return subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def test_freed_blocks_of_a_few_mib_leave_the_process() -> None:
    kept = _kept_mib("set")
    if kept == "no-glibc":
        pytest.skip("not glibc: the setting does not apply")
    assert int(kept) < 20, kept  # MiB still resident after 200 MiB of 4 MiB blocks were freed
    assert int(_kept_mib("default")) > 100  # the same program without it keeps them (the test can fail)
