"""
The twistd plugin's service factory: what it sets up for the process it serves in.
"""

from __future__ import annotations

import gc

from twisted.trial.unittest import SynchronousTestCase

from edgegw.service import GatewayService
from edgegw.tap import GC_YOUNG_THRESHOLD, Options, makeService
from tests.support.configs import GATEWAY, write_tree


class GarbageCollectorTests(SynchronousTestCase):
    def setUp(self) -> None:
        threshold = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *threshold)
        self.addCleanup(gc.unfreeze)

    def test_load_time_objects_frozen_and_threshold_raised(self) -> None:
        root = write_tree(self.mktemp(), {"gw.yaml": GATEWAY})
        gc.unfreeze()
        options = Options()
        options.parseOptions(["--config", root])
        service = makeService(options)
        self.assertIsInstance(service, GatewayService)
        self.assertEqual(gc.get_threshold()[0], GC_YOUNG_THRESHOLD)
        # The service tree built from the configuration is out of the collector's sight.
        self.assertGreater(gc.get_freeze_count(), 0)
        self.assertNotIn(service, gc.get_objects())
