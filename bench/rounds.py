"""
Interleaved wrk rounds: every round loads, at each load, every target still available in
turn, so that a slow drift of the machine hits them all alike. Subclassed by the
benchmarks that measure targets this way (C{api}, and C{authz} and C{telemetry} through
L{bench.variants}).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from bench import wrk
from bench.targets import Target


def say(text: str) -> None:
    """Print progress on stderr."""
    print(text, file=sys.stderr, flush=True)


class InterleavedRunner:
    """
    Runs the warm-up and then every (round, load, target) in interleaved order; a target
    that fails is marked unavailable and skipped from then on.

    Subclasses say what a target's URL is (L{url}), may give a target other connections
    than the load's (L{connections}), and record each run (L{measure}, with L{load}).

    @ivar wrk: The wrk binary.
    @ivar targets: Everything measured, in round order.
    @ivar rounds: How many rounds.
    @ivar warmup: Unrecorded seconds per target and load before round 1 (0: none).
    @ivar loads: The connection counts, in order.
    """

    def __init__(
        self,
        wrk_path: str,
        targets: Sequence[Target],
        rounds: int,
        warmup: int,
        loads: Sequence[int],
    ) -> None:
        self.wrk = wrk_path
        self.targets = targets
        self.rounds = rounds
        self.warmup = warmup
        self.loads = list(loads)

    def url(self, target: Target) -> str:
        """The URL wrk loads on C{target}."""
        raise NotImplementedError

    def connections(self, target: Target, load: int) -> int:
        """wrk's connections for C{target} at C{load}: the load itself."""
        return load

    def warmed(self, target: Target, result: wrk.WrkResult) -> None:
        """Called after C{target}'s warm-up run at one load; nothing by default."""

    def measure(self, round_: int, load: int, target: Target) -> None:
        """One recorded wrk run of C{target} at C{load} (see L{load})."""
        raise NotImplementedError

    def ready(self) -> list[Target]:
        """The targets still available."""
        return [target for target in self.targets if target.unavailable is None]

    def load(
        self,
        target: Target,
        load: int,
        duration: int,
        settle: Callable[[wrk.WrkResult], object] | None = None,
    ) -> tuple[wrk.WrkResult, float] | None:
        """
        L{wrk.measure} C{target} at C{load} for C{duration} seconds (C{settle} as there).

        @return: wrk's result and the CPU seconds of C{target}'s processes, or L{None}
            when wrk failed or the target's process exited: then the target is marked
            unavailable, with why.
        """
        try:
            measured = wrk.measure(
                self.wrk,
                self.url(target),
                self.connections(target, load),
                duration,
                target.pids,
                settle,
            )
        except wrk.WrkError as e:
            target.unavailable = f"wrk failed: {e}"
            return None
        target.check_alive()
        return measured if target.unavailable is None else None

    def warm_up(self) -> None:
        """Load every target at every load for the unrecorded warm-up seconds."""
        per = "target and load" if len(self.loads) > 1 else "target"
        say(f"warm-up: {self.warmup}s per {per}")
        for load in self.loads:
            for target in self.ready():
                try:
                    result = wrk.run(
                        self.wrk, self.url(target), self.connections(target, load), self.warmup
                    )
                except wrk.WrkError as e:
                    target.unavailable = f"wrk failed during warm-up: {e}"
                else:
                    self.warmed(target, result)
                target.check_alive()

    def run(self) -> None:
        """The warm-up, then every round."""
        if self.warmup > 0:
            self.warm_up()
        for round_ in range(1, self.rounds + 1):
            for load in self.loads:
                for target in self.ready():
                    self.measure(round_, load, target)
