"""Model runners: turn a scheduled step into tensors, run the model, sample."""

from omnistage.runner.ar_runner import ARModelRunner, build_ar_engine
from omnistage.runner.base import ARModel, Code2WavModel, TalkerModel
from omnistage.runner.generation_runner import GenerationRunner
from omnistage.runner.step_hook import StepHook
from omnistage.runner.talker_hook import TalkerRequestData, TalkerStepHook

__all__ = [
    "ARModel", "ARModelRunner", "Code2WavModel", "build_ar_engine", "GenerationRunner", "StepHook", "TalkerModel",
    "TalkerRequestData", "TalkerStepHook",
]
