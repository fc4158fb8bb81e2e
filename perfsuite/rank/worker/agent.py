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
  interpreter, so every node and environment resolves its own copy.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import traceback

from perfsuite.rank.worker.quickexit import exit_now, flush_streams

WORKER_MODULE = "perfsuite.rank.worker"


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
    from torch.distributed.run import main as torchrun

    # Ranks forked later must not inherit (and write a second time) what the
    # agent has buffered but not yet written.
    os.register_at_fork(before=flush_streams)
    try:
        torchrun(forked_ranks(sys.argv[1:]))
        code = 0
    except SystemExit as exc:
        code = exit_status(exc)
    except BaseException:  # printed, exit 1: as an uncaught one would be
        traceback.print_exc()
        code = 1
    exit_now(code)


if __name__ == "__main__":
    main()
