"""One history for a fleet: the ``--perf-history`` store kept on a branch of the repository.

Every runner that records nightly or main-branch runs appends its files to one branch
(``perf-history`` in the workflow ``init`` writes); pull-request runs never push. A history
file is one run (``DIR/<profile>/<UTC time>_<commit>.json``), so appending never edits what
is there: :func:`publish` builds a commit holding the branch's tree plus this store's new
files with git's plumbing (a private index, nothing checked out) and pushes it. When another
runner pushed first, the push is refused as not a fast-forward: it fetches the branch again
and rebuilds on top, so two runners appending at once both land and nothing is lost.
:func:`materialise` writes the branch's store into a folder that ``history`` and ``report
--history`` read. The checkout's remote and credentials are the ones used (actions/checkout
leaves them in the repository's config). Pytest side, torch-free.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

#: Tries of fetch, build, push before giving up: each refusal means another runner landed.
ATTEMPTS = 8
#: Who commits when the runner's git has no identity of its own.
IDENTITY = {
    "GIT_AUTHOR_NAME": "perfsuite",
    "GIT_AUTHOR_EMAIL": "perfsuite@localhost",
    "GIT_COMMITTER_NAME": "perfsuite",
    "GIT_COMMITTER_EMAIL": "perfsuite@localhost",
}


class SharedHistoryError(RuntimeError):
    """A git step that failed; the message names the command and git's own words."""


def publish(store: Path, repo: Path, branch: str, remote: str = "origin") -> list[str]:
    """Append ``store``'s run files missing from ``remote``'s ``branch`` and push; returns their paths."""
    files = sorted(p.relative_to(store).as_posix() for p in store.glob("*/*.json"))
    if not files:
        raise SharedHistoryError(f"no history files in {store} (record runs with pytest --perf-history={store})")
    for _ in range(ATTEMPTS):
        base = _fetch(repo, branch, remote)
        added = [f for f in files if f not in _listed(repo, base)]
        if not added:
            return []
        commit = _commit(repo, store, base, added, branch)
        pushed = _git(repo, "push", "--porcelain", remote, f"{commit}:refs/heads/{branch}", check=False)
        if pushed.returncode == 0:
            return added
        if "rejected" not in pushed.stdout + pushed.stderr and "fetch first" not in pushed.stderr:
            raise SharedHistoryError(f"git push {remote} {branch} failed: {pushed.stderr.strip()[-500:]}")
    raise SharedHistoryError(f"{remote}/{branch} moved under every one of {ATTEMPTS} pushes: run it again")


def materialise(repo: Path, branch: str, into: Path, remote: str = "origin") -> Path:
    """Write ``remote``'s ``branch`` (a history store) into ``into``; returns ``into``."""
    base = _fetch(repo, branch, remote)
    if base is None:
        raise SharedHistoryError(f"{remote} has no branch {branch!r}: nothing was published to it yet")
    archive = _git(repo, "archive", "--format=tar", base, text=False).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _fetch(repo: Path, branch: str, remote: str) -> str | None:
    """The branch's commit on the remote, fetched; None when the branch does not exist yet."""
    listed = _git(repo, "ls-remote", "--heads", remote, f"refs/heads/{branch}").stdout.split()
    if not listed:
        return None
    _git(repo, "fetch", "--quiet", remote, f"+refs/heads/{branch}:refs/perfsuite/{branch}")
    return _git(repo, "rev-parse", f"refs/perfsuite/{branch}").stdout.strip()


def _listed(repo: Path, base: str | None) -> set[str]:
    if base is None:
        return set()
    return set(_git(repo, "ls-tree", "-r", "--name-only", base).stdout.split())


def _commit(repo: Path, store: Path, base: str | None, added: list[str], branch: str) -> str:
    """A commit of ``base``'s tree plus ``added``, built in a private index (the checkout is untouched)."""
    with tempfile.TemporaryDirectory(prefix="perfsuite-history-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(repo, "read-tree", *([base] if base else ["--empty"]), env=env)
        for name in added:
            blob = _git(repo, "hash-object", "-w", str(store / name)).stdout.strip()
            _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{name}", env=env)
        tree = _git(repo, "write-tree", env=env).stdout.strip()
    parents = ["-p", base] if base else []
    message = f"perfsuite history: {len(added)} run(s) appended to {branch}"
    known = _git(repo, "var", "GIT_COMMITTER_IDENT", check=False).returncode == 0
    identity = None if known else {**os.environ, **IDENTITY}  # a fresh runner often has no user.email
    return _git(repo, "commit-tree", tree, *parents, "-m", message, env=identity).stdout.strip()


def _git(
    repo: Path, *args: str, check: bool = True, env: dict[str, str] | None = None, text: bool = True
) -> subprocess.CompletedProcess[Any]:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=text, env=env, check=False, timeout=120)
    if check and done.returncode != 0:
        said = done.stderr if text else done.stderr.decode(errors="replace")
        raise SharedHistoryError(f"git {' '.join(args)} in {repo} failed: {said.strip()[-500:]}")
    return done
