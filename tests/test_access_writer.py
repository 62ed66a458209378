"""
Tests for the buffered access-log writer and the C{accessLog.output} setting.
"""

from __future__ import annotations

import json
import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from edgegw.chain.access_writer import FLUSH_BYTES, FLUSH_INTERVAL, LineWriter
from edgegw.gateway import build_gateway
from tests.support.configs import load_text, problems_of
from tests.support.memory import MemoryClient


class LineWriterTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.path = os.path.join(self.directory, "access.log")
        self.clock = Clock()
        self.writer = LineWriter(self.clock, self.path)
        self.addCleanup(self.writer.close)

    def read(self) -> bytes:
        with open(self.path, "rb") as stream:
            return stream.read()

    def test_lines_are_batched_until_the_interval(self) -> None:
        self.writer.write(b'{"a":1}')
        self.writer.write(b'{"a":2}')
        self.assertEqual(self.read(), b"")
        self.clock.advance(FLUSH_INTERVAL)
        self.assertEqual(self.read(), b'{"a":1}\n{"a":2}\n')

    def test_large_batches_flush_at_once(self) -> None:
        line = b"x" * 1000
        for _ in range(FLUSH_BYTES // 1000 + 1):
            self.writer.write(line)
        self.assertGreaterEqual(len(self.read()), FLUSH_BYTES)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_line_after_close_is_written_at_once(self) -> None:
        self.writer.write(b'{"a":1}')
        self.writer.close()
        # A request that outlived the shutdown drain: its line is neither lost nor left
        # waiting on a timer.
        self.writer.write(b'{"late":true}')
        self.assertEqual(self.read(), b'{"a":1}\n{"late":true}\n')
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_reopened_after_rotation(self) -> None:
        self.writer.write(b"before")
        self.writer.flush()
        os.rename(self.path, self.path + ".1")
        self.writer.write(b"after")
        self.writer.flush()
        self.assertEqual(self.read(), b"after\n")
        with open(self.path + ".1", "rb") as stream:
            self.assertEqual(stream.read(), b"before\n")

    def test_close_flushes(self) -> None:
        writer = LineWriter(self.clock, self.path)
        writer.write(b"last")
        writer.close()
        self.assertEqual(self.read(), b"last\n")


class AccessLogOutputTests(SynchronousTestCase):
    def test_json_lines_to_a_file(self) -> None:
        root = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(root, "logs"))
        config = load_text(
            root,
            "kind: Gateway\nmetadata: {name: g}\nspec:\n  accessLog: {output: logs/access.log}\n"
            "---\nkind: Route\nmetadata: {name: h}\n"
            "spec: {match: GET /healthz, handler: {type: health}}\n",
            gateway=False,
        )
        output = os.path.join(root, "logs", "access.log")
        self.assertEqual(config.gateway.access_log.output, output)
        gateway = build_gateway(config, Clock())
        client = MemoryClient(gateway.site)
        client.request("GET", "/healthz", {"X-Request-Id": "r-1"})
        client.request("GET", "/missing")
        assert gateway.access_log.writer is not None
        gateway.access_log.writer.close()
        with open(output, "rb") as stream:
            lines = [json.loads(line) for line in stream.read().splitlines()]
        self.assertEqual(
            [(line["path"], line["status"], line["request_id"]) for line in lines],
            [("/healthz", 200, "r-1"), ("/missing", 404, "")],
        )

    def test_default_is_the_twistd_log(self) -> None:
        config = load_text(
            self.mktemp(),
            "kind: Route\nmetadata: {name: h}\nspec: {match: /, handler: {type: health}}\n",
        )
        self.assertEqual(config.gateway.access_log.output, "log")

    def test_missing_directory_is_an_error(self) -> None:
        root = os.path.abspath(self.mktemp())
        self.assertEqual(
            problems_of(
                root,
                "kind: Gateway\nmetadata: {name: g}\n"
                "spec: {accessLog: {output: nowhere/access.log}}\n",
                gateway=False,
            ),
            [
                f'document 1, Gateway "g": spec.accessLog.output: the directory of '
                f"{os.path.join(root, 'nowhere', 'access.log')} does not exist"
            ],
        )
