"""How this perfsuite was installed, so the workflow ``init`` writes installs exactly it.

pip records a direct install in the distribution's ``direct_url.json`` (PEP 610): a git URL
and its commit, an archive (a wheel) by its URL, or a local folder. What pip installed from an
index records nothing. A runner reaches a git URL or an https archive as this machine did; a
local wheel or folder it cannot, so the workflow installs the same version from the runner's
wheelhouse (``PERFSUITE_WHEELHOUSE``, e.g. one ``make wheelhouse`` filled) or its index.
Pytest side, torch-free.
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from perfsuite.store.vcs import git_output

#: The extras the workflow installs: the engines it gates, and the report its last step draws.
EXTRAS = "engines,report"


@dataclass(frozen=True)
class Install:
    """A pip requirement for the runner, and where it came from (in words, for the workflow's comment)."""

    requirement: str
    source: str


def how_installed(distribution: str = "perfsuite") -> Install:
    """This machine's perfsuite as a requirement a runner can install."""
    dist = importlib.metadata.distribution(distribution)
    named = f"{distribution}[{EXTRAS}]"
    pinned = Install(f"{named}=={dist.version}", f"version {dist.version} from an index or a wheelhouse")
    text = dist.read_text("direct_url.json")
    if not text:
        return pinned
    direct: dict[str, Any] = json.loads(text)
    url = str(direct.get("url", ""))
    if "vcs_info" in direct:
        vcs = direct["vcs_info"]
        return Install(f"{named} @ {vcs.get('vcs', 'git')}+{url}@{vcs['commit_id']}", f"{url} at {vcs['commit_id']}")
    if "dir_info" in direct:
        return _from_checkout(named, Path(unquote(urlparse(url).path))) or pinned
    if url.startswith(("https://", "http://")):
        return Install(f"{named} @ {url}", f"the archive {url}")
    return Install(
        pinned.requirement,
        f"version {dist.version}: installed here from {url}; put that wheel in the "
        "runner's wheelhouse (repository variable PERFSUITE_WHEELHOUSE)",
    )


def _from_checkout(named: str, folder: Path) -> Install | None:
    """A local checkout that a runner can clone: its remote's URL at the commit installed from."""
    remote = git_output(folder, "remote", "get-url", "origin")
    commit = git_output(folder, "rev-parse", "HEAD")
    if not remote or not commit or not remote.startswith(("https://", "ssh://", "git@")):
        return None
    url = remote if "://" in remote else "ssh://" + remote.replace(":", "/", 1)
    return Install(f"{named} @ git+{url}@{commit}", f"the checkout of {remote} at {commit}")
