"""Stage replicas as processes (the serving default): a real request, and no process outlives its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from omnistage.pipeline.omni import Omni
from omnistage.pipeline.runtime import PipelineOptions
from tests.pipeline.specs import small_dict, write_spec

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its dead parent's reaper) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_text_and_audio_through_stage_processes(tiny_dir: Path, tmp_path: Path) -> None:
    config = write_spec(tmp_path, small_dict(talker_frames=24))
    omni = Omni(tiny_dir, config, options=PipelineOptions(talker_min_new_tokens=12))
    try:
        links = omni.pipeline.runtime.orchestrator.links.values()
        pids = [link.handle.pid for link in links]
        assert len(set(pids)) == 3 and os.getpid() not in pids
        # Each replica lowered its own priority by its stage's nice (the preset's thinker: it runs ahead).
        nice = {link.stage: omni.pipeline.spec.stage(link.stage).nice for link in links}
        assert nice["thinker"] > 0 and nice["talker"] == 0
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert {link.stage: os.getpriority(os.PRIO_PROCESS, link.handle.pid) for link in links} == \
            {stage: min(own + n, 19) for stage, n in nice.items()}
        # `ps` tells them apart: each command line names its stage and replica.
        for link in links:
            args = Path(f"/proc/{link.handle.pid}/cmdline").read_bytes().decode().split("\0")
            assert args[args.index("--stage") + 1] == link.stage and args[args.index("--replica") + 1] == "0"
        start = time.monotonic()
        # A 2-frame first chunk (the per-request override) and a long answer keep the margin wide on busy CPUs.
        outputs = list(omni.generate("Hello!", modalities=["text", "audio"], stream=True, max_tokens=200,
                                     ignore_eos=True, seed=3, temperature=0.9, initial_codec_chunk_frames=2))
        total = time.monotonic() - start
        audio = np.concatenate([o.audio for o in outputs if o.audio is not None])
        assert outputs[-1].finished and outputs[-1].usage.completion_tokens == 200 and audio.size > 0
        trace = omni.pipeline.runtime.orchestrator.trace(outputs[-1].request_id)
        assert trace.entered["talker"] < trace.first_audio < trace.left["thinker"]
        print(f"processes: time to first audio {trace.time_to_first_audio * 1000:.0f} ms, "
              f"total {total * 1000:.0f} ms")
    finally:
        omni.close()
    assert _wait_gone(pids, 5) == []


SCRIPT = textwrap.dedent("""
    import sys, time
    from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
    from tests.pipeline import fakes
    from tests.pipeline.specs import small_spec

    if __name__ == "__main__":
        rt = PipelineRuntime(fakes.omni_graph(small_spec()), fakes.fake_factories(), None, fakes.AUDIO, PipelineOptions())
        print(" ".join(str(l.handle.pid) for l in rt.orchestrator.links.values()), flush=True)
        print(rt.addresses.folder, flush=True)
        time.sleep(120)
""")


def test_replicas_die_with_a_killed_parent(tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        sockets = Path(owner.stdout.readline().strip())
        assert sockets.is_dir()
        owner.send_signal(signal.SIGKILL)  # no atexit, no cleanup: only the replicas' own watch can help
        owner.wait(10)
        assert _wait_gone(pids, 5) == []
        assert not sockets.exists()  # the orphans removed their dead parent's sockets
    finally:
        if owner.poll() is None:
            owner.kill()


def test_a_dead_replica_fails_its_requests_and_reports_unhealthy() -> None:
    import queue

    from omnistage.core import FinishReason, Modality, OmniRequest
    from omnistage.sampling_params import SamplingParams
    from omnistage.pipeline.runtime import PipelineRuntime
    from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
    from tests.pipeline import fakes
    from tests.pipeline.specs import small_spec

    rt = PipelineRuntime(fakes.omni_graph(small_spec()), fakes.fake_factories(exit_on="die"), None, fakes.AUDIO, PipelineOptions())
    try:
        outputs: queue.Queue = queue.Queue()
        request = OmniRequest("die", Qwen3OmniPrompt([1]), frozenset({Modality.TEXT}), SamplingParams())
        rt.orchestrator.submit(request, outputs.put)
        final = outputs.get(timeout=10)
        assert final.finish_reason is FinishReason.ERROR and "'thinker' replica 0" in final.error
        assert not rt.orchestrator.health().healthy
    finally:
        rt.close()


def test_a_replica_process_that_cannot_load_reports_why() -> None:
    from omnistage.pipeline.orchestrator import PipelineStartError
    from omnistage.pipeline.runtime import PipelineRuntime
    from tests.pipeline import fakes
    from tests.pipeline.specs import small_spec

    factories = {**fakes.fake_factories(), "code2wav": fakes.broken_factory}
    with pytest.raises(PipelineStartError, match="'code2wav' replica 0 failed to start: OSError: weights not found"):
        PipelineRuntime(fakes.omni_graph(small_spec()), factories, None, fakes.AUDIO, PipelineOptions())


UNGUARDED = textwrap.dedent("""
    # No `if __name__ == "__main__"`: replicas are fresh interpreters, so this script is never re-imported.
    from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
    from tests.pipeline import fakes
    from tests.pipeline.specs import small_spec

    runtime = PipelineRuntime(fakes.omni_graph(small_spec()), fakes.fake_factories(), None, fakes.AUDIO,
                              PipelineOptions(ready_timeout_s=30))
    print("started")
    runtime.close()
    print("closed")
""")

OMNI_FROM_STDIN = textwrap.dedent("""
    from omnistage import Omni

    omni = Omni(model="tiny")
    outs = list(omni.generate("Hi", modalities=["text"], max_tokens=2, seed=0))
    print("tokens", sum(len(o.token_ids) for o in outs))
    omni.close()
""")


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_the_api_runs_from_an_unguarded_script_and_from_stdin(tmp_path: Path, how: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if how == "script":
        script = tmp_path / "unguarded.py"
        script.write_text(UNGUARDED)
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=120)
    else:
        run = subprocess.run([sys.executable, "-"], input=OMNI_FROM_STDIN, capture_output=True, text=True, env=env,
                             cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    if how == "script":
        assert "closed" in run.stdout and run.stdout.count("started") == 1  # the script ran once, not per replica
    else:
        assert "tokens 2" in run.stdout
