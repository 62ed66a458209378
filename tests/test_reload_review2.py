"""
Second review of issue 35 (reload hand-over, transactional swap, systemd truth):
regression tests for what the review found (each fails against the reviewed code).
"""

from __future__ import annotations

import os
import tempfile

from twisted.trial.unittest import TestCase

from edgegw.reload_outcome import OutcomeRecord, read_outcome, record_path


class OutcomeRecordFileTests(TestCase):
    """
    The daemon's reload record is written in a directory others may share (the worker
    units' RuntimeDirectory, or whatever --runtime-directory names).
    """

    def test_partial_symlink_not_followed(self) -> None:
        """
        A symbolic link planted at the record's fixed temporary name
        (C{.reload-<pid>.json.partial}) is not followed: the file it points at is left
        as it was (the record is still written).
        """
        directory = tempfile.mkdtemp()
        self.addCleanup(_rmtree, directory)
        victim = os.path.join(directory, "victim")
        with open(victim, "w") as f:
            f.write("precious\n")
        path = record_path(directory, os.getpid())
        os.symlink(victim, os.path.join(directory, f".{os.path.basename(path)}.partial"))

        record = OutcomeRecord(directory, 10.0)
        record.start()

        with open(victim) as f:
            self.assertEqual(f.read(), "precious\n")
        outcome = read_outcome(path)
        self.assertIsNotNone(outcome)


def _rmtree(directory: str) -> None:
    import shutil

    shutil.rmtree(directory, ignore_errors=True)
