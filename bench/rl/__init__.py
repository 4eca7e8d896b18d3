"""The colocated RL step: train -> offload -> rollout -> weight sync -> reload, timed phase by phase.

Each rank holds a trainer and a rollout role on one device; between them the trainer's state goes to host memory
through an :class:`~refimpl.store.OffloadStore` and its group through a :class:`~refimpl.comm.PGLifecycle`, and
the rollout gets the trainer's weights, checked bitwise after every sync. Read it in this order:

:mod:`bench.rl.step`         one rank's run: the roles set up, the steps run, the record made (:func:`run_step`)
:mod:`bench.rl.phases`       the phases of one step, in order (:class:`~bench.rl.phases.ColocatedStep`)
:mod:`bench.rl.modes`        how a switch runs: ``sequential``, ``overlapped``, ``streamed``, and the sync first
:mod:`bench.rl.early_copies` the optimizer stepped in the backward, each unit's state copied early
:mod:`bench.rl.trainer`      the trainer role (FSDP2 / HSDP, its optimizers)
:mod:`bench.rl.groups`       the trainer's process groups: the mesh's, under the lifecycle, and which carries what
:mod:`bench.rl.rollout`      the rollout role (generation into a KV cache in the memory the trainer freed)
:mod:`bench.rl.weights`      the weight sync's copy and its bitwise check
:mod:`bench.rl.record`       what is written: spans, step records, the summary and the switch cost
:mod:`bench.rl.clock`        the phases' clock and the copy line rates
:mod:`bench.rl.config`       what to run (:class:`StepConfig`) and the model
:mod:`bench.rl.command`      the command line (``python -m bench.rl``; ``bench/gpu/rl_step.py`` under ``torchrun``)
"""
from bench.rl.command import main, parse_args
from bench.rl.config import StepConfig, model_config
from bench.rl.early_copies import StepInBackward
from bench.rl.modes import MODES, SwitchDriver
from bench.rl.record import PHASES, summarize, switch_costs, write_outputs
from bench.rl.step import run_step
from bench.rl.weights import bitwise_equal, digest

__all__ = ["MODES", "PHASES", "StepConfig", "StepInBackward", "SwitchDriver", "bitwise_equal", "digest", "main",
           "model_config", "parse_args", "run_step", "summarize", "switch_costs", "write_outputs"]
