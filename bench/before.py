"""
C{--before REV}: edgegw from another git revision, as an extra target of the same run.

The revision is checked out with C{git worktree add --detach} into the run's scratch
directory (and removed again afterwards, C{--keep-tmp} or not). Its processes run the
virtualenv's C{twistd} and C{edgegw} scripts with C{PYTHONPATH} set to the worktree and
the worktree as their working directory, so that C{edgegw} and the
C{twisted/plugins/edgegw_plugin.py} that twistd finds come from there; the dependencies
are the virtualenv's. L{Checkout.verify} checks that this is so, by importing the way
twistd does with the same environment, before anything is measured. (The working tree's
C{twisted/plugins} is on the plugin path too, through the editable install's path entry,
but after the worktree's, and C{twisted.plugins.edgegw_plugin} loads once, from the
first; both name C{edgegw.tap}, imported from the worktree. The check covers it all.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from bench.processes import StartupError
from tests.support.processes import REPO_ROOT

# What twistd does to find the edgegw plugin and its service maker, printed as paths.
# Run with -P: like the twistd script (whose sys.path[0] is the virtualenv's bin), the
# working directory is not put first on sys.path.
_WHERE = """
import importlib, json
import edgegw
from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
makers = [m for m in getPlugins(IServiceMaker) if m.tapname == "edgegw"]
print(json.dumps({
    "edgegw": edgegw.__file__,
    "service makers": [importlib.import_module(m.module).__file__ for m in makers],
}))
"""


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@attrs.frozen
class Checkout:
    """
    A git worktree of edgegw at one revision.

    @ivar rev: The revision as given (C{3bc2d18}, C{HEAD~1}).
    @ivar commit: The commit it names, in full.
    @ivar path: The worktree's directory.
    """

    rev: str
    commit: str
    path: Path

    @property
    def short(self) -> str:
        """The commit, abbreviated for labels."""
        return self.commit[:9]

    @property
    def env(self) -> dict[str, str]:
        """The environment its processes run with: the harness's, the worktree first."""
        paths = [str(self.path), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
        return {**os.environ, "PYTHONPATH": ":".join(paths)}

    def contains(self, path: str) -> bool:
        """Whether C{path} is inside the worktree."""
        return Path(path).resolve().is_relative_to(self.path.resolve())

    def verify(self) -> dict[str, Any]:
        """
        Import C{edgegw} and twistd's C{edgegw} service maker with this checkout's
        environment and working directory, as its twistd will.

        @return: Where each came from.
        @raise StartupError: When any of them is not the worktree's.
        """
        done = subprocess.run(
            [sys.executable, "-P", "-c", _WHERE],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise StartupError(
                f"cannot import edgegw from the worktree of {self.rev}:\n{done.stderr.strip()}"
            )
        where: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        makers: list[str] = where["service makers"]
        files: list[str] = [where["edgegw"], *makers]
        if not makers or not all(self.contains(file) for file in files):
            raise StartupError(
                f"edgegw at {self.rev} would not run the worktree's code "
                f"({self.path}): {json.dumps(where)}"
            )
        return where


def resolve(rev: str) -> str:
    """
    The full commit C{rev} names.

    @raise StartupError: When it names none.
    """
    done = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode != 0 or not done.stdout.strip():
        raise StartupError(f"--before {rev!r}: not a commit of {REPO_ROOT}")
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(tmp: Path, rev: str) -> Iterator[Checkout]:
    """
    A detached worktree of C{rev} in C{tmp}, verified (L{Checkout.verify}), removed on
    the way out.

    @raise StartupError: When C{rev} is no commit, the worktree cannot be added, or it
        does not run its own code.
    """
    commit = resolve(rev)
    path = tmp / f"edgegw-{commit[:12]}"
    added = _git("worktree", "add", "--detach", str(path), commit)
    if added.returncode != 0:
        raise StartupError(f"git worktree add {rev} failed: {added.stderr.strip()}")
    try:
        checkout = Checkout(rev, commit, path)
        where = checkout.verify()
        print(
            f"bench: --before {rev}: edgegw {commit} in {path} (edgegw from {where['edgegw']})",
            file=sys.stderr,
            flush=True,
        )
        yield checkout
    finally:
        # --force: running it left untracked files (twisted/plugins/dropin.cache,
        # __pycache__).
        if _git("worktree", "remove", "--force", str(path)).returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            _git("worktree", "prune")
