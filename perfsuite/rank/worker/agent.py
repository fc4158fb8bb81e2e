"""``python -m perfsuite.rank.worker.agent ARGS``: a torchrun agent (launched side,
beside the ranks it starts; the launcher only names this module).

It is ``torch.distributed.run``'s own ``main`` with the same arguments, output
and exit status, except that:

- it leaves without the interpreter's teardown (:mod:`perfsuite.rank.worker.quickexit`);
- ``--start-method fork -m perfsuite.rank.worker`` forks the ranks from this agent
  instead of starting an interpreter each: torchrun's ``--run-path`` on the
  worker's file, which torchrun runs in-process in workers started with the
  given method. torch is imported once per node instead of once per rank.
  (torchrun ignores ``--start-method`` for a ``-m`` module, which it always
  runs as a new interpreter.) The file is found here, in the agent's own
  interpreter, so every node and environment resolves its own copy;
- it hands its ranks when it started and when it had imported torch
  (:mod:`perfsuite.rank.worker.marks`), for the launch's timeline.

Forked ranks can use CUDA only if the agent never initialised it. torchrun
itself asks ``torch.cuda.is_available()`` while it builds its launch config
(``LaunchConfig.__post_init__``, before it considers default NUMA bindings; torch 2.13):
by default that is ``cudaGetDeviceCount``, which initialises the driver and
registers torch's fork poison (``poison_fork`` in ``torch/csrc/cuda/Module.cpp``),
so every forked rank's first CUDA call would raise "Cannot re-initialize CUDA
in forked subprocess". An agent that forks therefore sets
``PYTORCH_NVML_BASED_CUDA_CHECK=1``, under which ``is_available`` counts the
GPUs through NVML and, in torch's words, does not poison fork.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import time
import traceback

from perfsuite.rank.worker.marks import hand_to_ranks, process_start
from perfsuite.rank.worker.quickexit import exit_now, flush_streams

WORKER_MODULE = "perfsuite.rank.worker"
#: Makes ``torch.cuda.is_available()`` (and ``device_count()``) ask NVML rather than
#: initialise CUDA, which would leave forked ranks unable to use it (see above).
NVML_CHECK = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def exit_status(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # as the interpreter does for a message
    return 1


def forked_ranks(argv: list[str]) -> list[str]:
    """``argv`` with ``-m perfsuite.rank.worker`` replaced by ``--run-path FILE``
    when the ranks are to be forked (``--start-method fork``); else unchanged."""
    entry = ["-m", WORKER_MODULE]
    at = next((i for i in range(len(argv) - 1) if argv[i : i + 2] == entry), None)
    if at is None:
        return argv
    options = argv[:at]  # torchrun's own; what follows is the worker's
    pairs = itertools.pairwise(options)
    if "--start-method=fork" not in options and ("--start-method", "fork") not in pairs:
        return argv
    spec = importlib.util.find_spec(f"{WORKER_MODULE}.__main__")
    if spec is None or spec.origin is None:
        raise ImportError(f"{WORKER_MODULE}.__main__ is not importable from {sys.executable}")
    return [*options, "--run-path", spec.origin, *argv[at + 2 :]]


def main() -> None:
    started = process_start()
    argv = forked_ranks(sys.argv[1:])
    if argv != sys.argv[1:]:  # the ranks are forked
        os.environ.update(NVML_CHECK)  # before torchrun's first question to torch.cuda
    from torch.distributed.run import main as torchrun

    hand_to_ranks({"agent_start": started, "agent_torch": time.time()})
    # Ranks forked later must not inherit (and write a second time) what the
    # agent has buffered but not yet written.
    os.register_at_fork(before=flush_streams)
    try:
        torchrun(argv)
        code = 0
    except SystemExit as exc:
        code = exit_status(exc)
    except BaseException:  # printed, exit 1: as an uncaught one would be
        traceback.print_exc()
        code = 1
    exit_now(code)


if __name__ == "__main__":
    main()
