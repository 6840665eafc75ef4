"""vLLM's ``AudioAsset(name).url``: a public recording's URL. Here a data: URL of the file the test names in
``VLLM_SHIM_AUDIO`` (the server fetches no network), so ``--query-type use_audio`` runs offline."""

import base64
import os


class AudioAsset:
    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def url(self) -> str:
        with open(os.environ["VLLM_SHIM_AUDIO"], "rb") as f:
            return "data:audio/wav;base64," + base64.b64encode(f.read()).decode("ascii")
