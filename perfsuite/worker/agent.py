"""``python -m perfsuite.worker.agent ARGS``: a torchrun agent (launched side,
beside the ranks it starts; the launcher only names this module).

It is ``torch.distributed.run``'s own ``main`` with the same arguments, output
and exit status, except that it leaves without the interpreter's teardown
(:mod:`perfsuite.worker.quickexit`). torch is imported only here, in the
agent's process.
"""

from __future__ import annotations

import sys
import traceback

from perfsuite.worker.quickexit import exit_now


def exit_status(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # as the interpreter does for a message
    return 1


def main() -> None:
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
        code = 0
    except SystemExit as exc:
        code = exit_status(exc)
    except BaseException:  # printed, exit 1: as an uncaught one would be
        traceback.print_exc()
        code = 1
    exit_now(code)


if __name__ == "__main__":
    main()
