"""README.md's fenced blocks, run: every command and code block the README shows is either run here against a real
``omnistage serve`` (the README's own serve command, on a free port), parsed by the CLI's parser, or listed below as
not run with the reason. A block or command this file does not know fails the test, so the README cannot drift.

One server for the module (~20 s to start on 2 cores); the blocks take a few seconds each.
"""

from __future__ import annotations

import ast
import base64
import inspect
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OMNISTAGE = ".venv/bin/omnistage"
DOCS_ADDRESS = "127.0.0.1:8000"  # where the README's examples talk to the server
SERVE_PORT = "8001"  # the README's `omnistage serve tiny --port 8001` is the module's server
QUICKSTART_LINES = 30

# Commands shown but not run here, each with why. Keyed by the command's first words.
NOT_RUN = {
    ("make", "serve"): "builds .venv and serves in the foreground; CI runs `make serve`, and the serve command it runs "
                       "is the README's `omnistage serve tiny`, which this module serves",
    ("make", "test"): "runs the whole suite, this file included; CI runs it",
    ("export",): "sets the reader's shell environment (the API key); tests/entrypoints/test_auth.py covers keys",
    ("scripts/gpu_check.sh",): "needs a GPU (--cpu: minutes of interpreted Triton); run by hand on a GPU machine",
    ("scripts/gpu_rehearsal.sh",): "downloads and builds a second virtualenv of the GPU image's versions (~2 min, "
                                   "~1 GB); run by hand before a GPU window (docs/gpu.md)",
}
# `make-tiny` options too large or slow to run here: parsed only.
MAKE_TINY_HEAVY = ("--size", "--fp8", "--confident-head")
# Python blocks not run, keyed by a line of theirs: their calls are bound to the real signatures instead.
PYTHON_NOT_RUN = {
    "omni = Omni(model=": "starts its own three-process pipeline (~25 s on 2 cores, as long as the server); "
                         "tests/pipeline/test_omni_e2e.py runs Omni.generate",
}


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # README line of the opening fence


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    line: int


def readme_blocks() -> list[Block]:
    blocks, lines, opened = [], README.read_text().split("\n"), None
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            if opened is None:
                opened = (line[3:].strip(), number)
            else:
                lang, start = opened
                blocks.append(Block(lang, "\n".join(lines[start:number - 1]) + "\n", start))
                opened = None
    assert opened is None, f"README.md:{opened[1]}: a fence that never closes"
    return blocks


def block_commands(block: Block) -> list[Command]:
    """A bash block's commands: lines joined across ``\\`` and open quotes, comments dropped, split as bash would."""
    commands, pending, start = [], "", block.line + 1
    for offset, line in enumerate(block.text.rstrip("\n").split("\n")):
        pending = pending + line if pending else line
        if not pending.strip():
            continue
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            argv = shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            pending += "\n"
            continue
        if argv:
            commands.append(Command(tuple(argv), start))
        pending, start = "", block.line + offset + 2
    assert not pending.strip(), f"README.md:{block.line}: unfinished command {pending!r}"
    return commands


def how(cmd: Command) -> str:
    """How this file proves a README command: 'server', 'curl', 'run', 'parse', or 'not run: why'."""
    argv = cmd.argv
    for prefix, why in NOT_RUN.items():
        if argv[:len(prefix)] == prefix:
            return f"not run: {why}"
    if argv[0] == "curl":
        return "curl"
    if argv[0] == OMNISTAGE and argv[1] == "serve" and "--port" in argv:
        return "server"
    if argv[0] == OMNISTAGE and argv[1] == "make-tiny":
        return "parse" if any(flag in argv for flag in MAKE_TINY_HEAVY) else "run"
    if argv[0] == OMNISTAGE and argv[1] in ("serve", "verify", "bench", "plan", "make-tiny"):
        return "parse"
    raise AssertionError(f"README.md:{cmd.line}: `{shlex.join(argv)}` is not classified in {Path(__file__).name}: "
                         "run it, parse it, or add it to NOT_RUN with the reason")


def not_run_why(block: Block) -> str | None:
    return next((why for key, why in PYTHON_NOT_RUN.items() if key in block.text), None)


BLOCKS = readme_blocks()
COMMANDS = [cmd for block in BLOCKS if block.lang == "bash" for cmd in block_commands(block)]
PYTHON_BLOCKS = [block for block in BLOCKS if block.lang == "python" and not_run_why(block) is None]
PYTHON_CHECKED = [block for block in BLOCKS if block.lang == "python" and not_run_why(block) is not None]


def _ids(items: list) -> list[str]:
    return [f"line{item.line}" for item in items]


def _with_commands(kind: str) -> list[Command]:
    return [cmd for cmd in COMMANDS if how(cmd) == kind]


def test_the_quickstart_is_the_first_screen() -> None:
    first = "\n".join(README.read_text().split("\n")[:QUICKSTART_LINES])
    for needed in ("make serve", "make test", "http://127.0.0.1:8000", "random", "curl ", "```python",
                   "pip install openai", "make serve PORT=", f"{OMNISTAGE} serve tiny --port {SERVE_PORT}", "Next:"):
        assert needed in first, f"the README's first {QUICKSTART_LINES} lines lack {needed!r}"


def test_every_block_and_command_is_classified() -> None:
    assert {block.lang for block in BLOCKS} <= {"bash", "python"}, "a block in a language this file cannot run"
    kinds = {cmd.line: how(cmd) for cmd in COMMANDS}  # raises on an unclassified command
    assert list(kinds.values()).count("server") == 1, "exactly one README serve command should name --port"
    assert "curl" in kinds.values() and PYTHON_BLOCKS
    assert len(PYTHON_CHECKED) == len(PYTHON_NOT_RUN), "a PYTHON_NOT_RUN entry matches no README block"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Served:
    port: int
    env: dict[str, str]

    def rewrite(self, text: str) -> str:
        return text.replace(DOCS_ADDRESS, f"127.0.0.1:{self.port}")


def _serve_argv(port: int) -> list[str]:
    (cmd,) = _with_commands("server")
    argv = list(cmd.argv)
    argv[argv.index("--port") + 1] = str(port)
    return [str(ROOT / argv[0]), *argv[1:]]


def _wait_ready(proc: subprocess.Popen, port: int, log: Path, argv: list[str], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-3000:]
            hint = ""
            if "unrecognized arguments" in tail or "invalid choice" in tail:
                hint = ("\nThe README serves with `omnistage serve tiny` (the model as a positional argument, as "
                        "`vllm serve MODEL`): the CLI must accept `omnistage serve [MODEL]`.")
            raise AssertionError(f"`{shlex.join(argv)}` exited with {proc.returncode}:\n{tail}{hint}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"`{shlex.join(argv)}` was not healthy within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The README's serve command, on a free port, with a private model cache (the tiny model is made there)."""
    home = tmp_path_factory.mktemp("readme_server")
    env = {**os.environ, "OMNISTAGE_CACHE": str(home / "cache")}
    port = _free_port()
    argv = _serve_argv(port)
    log = home / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_ready(proc, port, log, argv)
        yield Served(port, env)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _assert_wav(data: bytes, what: str) -> None:
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and len(data) > 44 + 2400, f"{what} is not speech as WAV"


def _write_uploads(argv: list[str], folder: Path) -> None:
    """A second of tone for each file a curl uploads (``-F file=@NAME``, as the speech example's output)."""
    import numpy as np
    import soundfile as sf

    for arg in argv:
        if arg.startswith("file=@"):
            tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)
            sf.write(folder / arg[len("file=@"):], tone.astype(np.float32), 16000, subtype="PCM_16")


@pytest.mark.parametrize("cmd", _with_commands("curl"), ids=_ids(_with_commands("curl")))
def test_curl_commands(cmd: Command, served: Served, tmp_path: Path) -> None:
    argv = [served.rewrite(arg) for arg in cmd.argv]
    _write_uploads(argv, tmp_path)
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 0, f"README.md:{cmd.line}: curl exited {done.returncode}: {done.stderr.decode()}"
    if "-o" in argv:
        _assert_wav((tmp_path / argv[argv.index("-o") + 1]).read_bytes(), f"README.md:{cmd.line}'s output")
        return
    reply = json.loads(done.stdout)
    assert "error" not in reply, reply
    if any("/v1/audio/transcriptions" in arg or "/v1/audio/translations" in arg for arg in argv):
        assert isinstance(reply["text"], str), reply
        if any(arg.endswith("verbose_json") for arg in argv):
            assert reply["segments"] and all(s["end"] > s["start"] for s in reply["segments"]), reply
        return
    message = reply["choices"][0]["message"]
    assert message["content"] or message["audio"]["transcript"]
    if "audio" in " ".join(argv):
        _assert_wav(base64.b64decode(message["audio"]["data"]), f"README.md:{cmd.line}'s audio")


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=_ids(PYTHON_BLOCKS))
def test_python_blocks(block: Block, served: Served, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", served.rewrite(block.text)], cwd=tmp_path, env=served.env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"README.md:{block.line}: the block failed:\n{done.stderr[-3000:]}"
    wavs = re.findall(r'open\("([^"]+\.wav)", "wb"\)', block.text)
    for wav in wavs:
        _assert_wav((tmp_path / wav).read_bytes(), f"README.md:{block.line}'s {wav}")
    for samples in re.findall(r"^(\d+) samples$", done.stdout, re.M):
        assert int(samples) > 0, f"README.md:{block.line} received no audio"
    assert wavs or done.stdout.strip(), f"README.md:{block.line} neither wrote a WAV nor printed anything"


def _in_tmp(argv: tuple[str, ...], tmp_path: Path) -> list[str]:
    """The README writes checkpoints under /tmp/NAME; here they go under the test's own folder."""
    return [str(tmp_path / arg[len("/tmp/"):]) if arg.startswith("/tmp/") else arg for arg in argv[1:]]


@pytest.mark.parametrize("cmd", _with_commands("run"), ids=_ids(_with_commands("run")))
def test_cheap_make_tiny_commands_run(cmd: Command, tmp_path: Path) -> None:
    from omnistage.entrypoints.cli import main

    argv = _in_tmp(cmd.argv, tmp_path)
    assert main(argv) == 0, f"README.md:{cmd.line}: `{shlex.join(cmd.argv)}` failed"
    out = Path(next(arg for arg in argv if arg.startswith(str(tmp_path))))
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("cmd", _with_commands("parse"), ids=_ids(_with_commands("parse")))
def test_other_commands_parse(cmd: Command, tmp_path: Path) -> None:
    """Too large or slow to run here (real widths, GPUs, benches): the CLI must still accept them as written."""
    from omnistage.entrypoints.cli import build_parser

    try:
        build_parser().parse_args(_in_tmp(cmd.argv, tmp_path))
    except SystemExit as exc:
        pytest.fail(f"README.md:{cmd.line}: `{shlex.join(cmd.argv)}` does not parse (exit {exc.code})")


@pytest.mark.parametrize("block", PYTHON_CHECKED, ids=_ids(PYTHON_CHECKED))
def test_python_blocks_not_run_still_match_the_api(block: Block) -> None:
    """Each ``Omni(...)`` and ``.generate(...)`` call of the block binds to the real signatures: ``generate``
    forwards to ``Omni.request``, whose leftover keywords must be ``SamplingParams`` fields."""
    from omnistage import Omni, SamplingParams

    targets = {"Omni": inspect.signature(Omni), "generate": inspect.signature(Omni.request)}
    calls = [node for node in ast.walk(ast.parse(block.text)) if isinstance(node, ast.Call)]
    named = [call for call in calls if (getattr(call.func, "id", None) or getattr(call.func, "attr", None)) in targets]
    for call in named:
        name = getattr(call.func, "id", None) or call.func.attr
        where = f"README.md:{block.line + call.lineno}: {name}(...)"
        self_arg = [None] if name == "generate" else []
        try:
            bound = targets[name].bind(*self_arg, *call.args, **{kw.arg: kw.value for kw in call.keywords})
        except TypeError as exc:
            pytest.fail(f"{where} no longer matches the API: {exc}")
        unknown = [key for key in bound.arguments.get("sampling", {}) if not hasattr(SamplingParams(), key)]
        assert not unknown, f"{where}: {unknown} are not sampling parameters"
    assert len(named) >= 2, f"README.md:{block.line}: expected Omni(...) and .generate(...) calls"
