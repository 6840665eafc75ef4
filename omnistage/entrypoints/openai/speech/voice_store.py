"""Registered voices on disk, one folder per voice under the folder the operator names (``--voices-dir``).

A voice is written aside and renamed into place, so a crash or a concurrent registration never leaves half of
one; names are short and plain (they become folder names). What a voice folder holds is the served family's
business (:meth:`omnistage.families.speech.SpeechFrontEnd.save_voice`), plus ``meta.json`` written here.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
META = "meta.json"

logger = logging.getLogger(__name__)


class VoiceStoreError(ValueError):
    """code: ``invalid_voice_name``, ``voice_exists``, ``voice_not_found`` or ``too_many_voices``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class StoredVoice:
    name: str
    created_at: int
    mode: str  # how it was cloned, as the front end says (``SpeechFrontEnd.clone_mode``)


class VoiceStore:
    def __init__(self, root: Path, max_voices: int) -> None:
        self.root, self.max_voices = Path(root), max_voices
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def check_name(self, name: str) -> None:
        if not NAME.fullmatch(name):
            raise VoiceStoreError("invalid_voice_name", "a voice name is 1-64 letters, digits, '_' or '-', starting "
                                                        "with a letter or digit")

    def add(self, name: str, mode: str, write: Callable[[Path], None]) -> StoredVoice:
        """Writes a new voice with ``write(folder)``; the name must be free and the store below its size."""
        self.check_name(name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
        try:
            write(tmp)
            voice = StoredVoice(name, int(time.time()), mode)
            (tmp / META).write_text(json.dumps({"name": name, "created_at": voice.created_at, "mode": mode}))
            with self._lock:
                if (self.root / name).exists():
                    raise VoiceStoreError("voice_exists", f"a voice named {name!r} exists; delete it first")
                if len(self.names()) >= self.max_voices:
                    raise VoiceStoreError("too_many_voices", f"the server keeps at most {self.max_voices} voices "
                                                             f"(--max-voices); delete one first")
                tmp.rename(self.root / name)
            return voice
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def names(self) -> list[str]:
        """The registered voices: folders with a voice name and a ``meta.json`` (a stray folder is no voice)."""
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and NAME.fullmatch(p.name) and (p / META).is_file())

    def list(self) -> list[StoredVoice]:
        """The voices whose ``meta.json`` reads; one that does not is left out (and logged), not a 500."""
        voices = []
        for name in self.names():
            try:
                voices.append(self.get(name))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("voice %r left out of the listing: unreadable %s (%s)", name, META, exc)
        return voices

    def get(self, name: str) -> StoredVoice:
        folder = self.folder(name)
        meta = json.loads((folder / META).read_text())
        return StoredVoice(name, int(meta["created_at"]), str(meta["mode"]))

    def folder(self, name: str) -> Path:
        self.check_name(name)
        folder = self.root / name
        if not (folder / META).is_file():
            raise VoiceStoreError("voice_not_found", f"no voice named {name!r} is registered")
        return folder

    def delete(self, name: str) -> None:
        folder = self.folder(name)
        with self._lock:
            trash = Path(tempfile.mkdtemp(prefix=".deleted-", dir=self.root))
            folder.rename(trash / name)  # gone from the listing at once, removed after
        shutil.rmtree(trash, ignore_errors=True)
