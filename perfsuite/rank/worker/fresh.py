"""What a forked process resets so that it runs as a fresh interpreter would (launched side):
the BLAS thread pool's size and the interpreter's start-up hooks. A forked agent
(:mod:`perfsuite.rank.worker.warmparent`) and a forked rank (:mod:`perfsuite.rank.worker.__main__`)
inherit the pool their parent sized when it loaded OpenBLAS, before torchrun set
``OMP_NUM_THREADS`` for the ranks. Also the imports both make before a launch (:func:`preload`)."""

from __future__ import annotations

import importlib
import os
import site
import sys
import traceback
from collections.abc import Mapping, Sequence

#: The variables OpenBLAS reads for its thread count when it loads, in its order.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
KMP_VAR = "KMP_DUPLICATE_LIB_OK"


def blas_threads(env: Mapping[str, str]) -> int:
    """The BLAS threads OpenBLAS would start with in a fresh interpreter with ``env``: the
    first positive count of :data:`BLAS_THREAD_VARS`, else one per usable CPU."""
    for name in BLAS_THREAD_VARS:
        value = env.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0))


def size_blas_pool(env: Mapping[str, str]) -> None:
    """Size the BLAS pool as a fresh interpreter with ``env`` would have. threadpoolctl's import
    sets ``KMP_DUPLICATE_LIB_OK`` in the environment, which a fresh interpreter would not have."""
    before = os.environ.get(KMP_VAR)
    import threadpoolctl  # type: ignore[import-untyped]

    threadpoolctl.threadpool_limits(blas_threads(env), user_api="blas")
    if before is None:
        os.environ.pop(KMP_VAR, None)


def run_site_hooks() -> None:
    """Run ``sitecustomize`` and ``usercustomize`` as an interpreter's start would, from this
    process's import path: a team's hook in its checkout (a patch, a tracer) must run in the
    agent a warm parent forked for its launch, not only in the parent, which started elsewhere."""
    hooks = ["sitecustomize", *(["usercustomize"] if site.ENABLE_USER_SITE else [])]
    for name in hooks:
        sys.modules.pop(name, None)
        try:
            importlib.import_module(name)
        except ImportError as exc:
            if exc.name != name:  # the hook exists and failed: site prints it and goes on
                traceback.print_exc()
        except Exception:
            traceback.print_exc()


def preload(modules: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Import ``modules`` (a warm parent's, or a rank's before its memory budget); (the ones imported,
    module -> why not for the others). A module that fails is left to the code that needs it, to
    report in its words, as an exec'd rank would."""
    done: list[str] = []
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as exc:  # any import error is the rank's to report
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    return done, failed
