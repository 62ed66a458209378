"""
The layout issue 32 asked for: module names that say their concern (no file name used
twice in edgegw/), and modules of about 700 lines at most unless docs/architecture.md
says why one must be one piece.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

ROOT = Path(__file__).parent.parent
LONGEST = 750
"""About 700 lines: what a module may hold before it is split."""


def _modules() -> list[Path]:
    return sorted((ROOT / "edgegw").rglob("*.py"))


class ModuleLayoutTests(SynchronousTestCase):
    def test_no_file_name_is_used_twice(self) -> None:
        names = Counter(path.name for path in _modules() if path.name != "__init__.py")
        self.assertEqual([name for name, count in names.items() if count > 1], [])

    def test_long_modules_say_why_in_the_docs(self) -> None:
        """
        A module over the bound is named, with its line count, in a paragraph of
        docs/architecture.md that says it is one piece.
        """
        docs = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
        for path in _modules():
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines <= LONGEST:
                continue
            relative = path.relative_to(ROOT / "edgegw").as_posix()
            said = re.search(
                rf"\*\*`{re.escape(relative)}` is one piece \(([0-9,]+) lines\)\.\*\*", docs
            )
            self.assertIsNotNone(said, f"{relative} has {lines} lines and no reason in the docs")
            assert said is not None
            self.assertEqual(int(said.group(1).replace(",", "")), lines, relative)
