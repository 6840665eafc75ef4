"""A FakeEngine server in its own process, for tests that measure the server's memory alone.

    python -m tests.entrypoints.fake_server PROCESSOR_DIR '{"max_request_bytes": 67108864}'

prints the port it listens on (127.0.0.1), then serves until killed. SIGUSR1 collects garbage and hands the
allocator's free pages back to the OS (glibc ``malloc_trim``), so a test reads the memory the server still
holds rather than the heap's high-water mark.
"""

from __future__ import annotations

import ctypes
import gc
import json
import signal
import sys
import time

from collections.abc import AsyncIterator

from omnistage.core import OmniOutput, OmniRequest
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor
from tests.entrypoints.fake_engine import FakeEngine, fake_front_end
from tests.entrypoints.server_thread import ServerThread


class _ForgetfulEngine(FakeEngine):
    """Keeps no record of its requests (their prompts' tensors would count as the server's memory)."""

    async def generate(self, request: OmniRequest) -> AsyncIterator[OmniOutput]:
        try:
            async for out in super().generate(request):
                yield out
        finally:  # also when the server stops reading at the final output and closes this generator
            self.requests.clear()
            self.closed.clear()
            self.aborted.clear()


def _trim(*_: object) -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: RSS is then read untrimmed


def main() -> None:
    signal.signal(signal.SIGUSR1, _trim)
    processor = Qwen3OmniPromptProcessor.from_folder(sys.argv[1])
    limits = ServerLimits(**json.loads(sys.argv[2]))
    url = ServerThread(build_app(_ForgetfulEngine(fake_front_end(processor)), limits)).start()
    print(url.rsplit(":", 1)[1], flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
