"""A speech recogniser served beside the model (``omnistage serve OMNI --transcription-model ASR_DIR``).

Its own pipeline (its stages, engines and KV caches), listed by ``/v1/models`` under its own name, and taken
when a request names it: ``/v1/audio/transcriptions`` and ``translations`` with ``model`` = that name, and a
realtime session's ``audio.input.transcription.model`` (the user's turns written down by it, while the model
answers them). Its requests take places under the server's one admission bound (``Admission.beside``).
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.engine_protocol import OmniEngine


@dataclass(frozen=True)
class ServedRecogniser:
    engine: OmniEngine
    served: ServedModel  # the names requests give it by
    admission: Admission  # its health, the server's bound

    @classmethod
    def beside(cls, engine: OmniEngine, admission: Admission) -> ServedRecogniser:
        """``engine`` served under its model name, admitted under ``admission``'s bound."""
        return cls(engine, ServedModel.of(engine), admission.beside(engine))

    def serves(self, name: object) -> bool:
        return isinstance(name, str) and name in self.served.names
