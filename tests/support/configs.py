"""
Helpers for tests that write configurations to disk.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping

from edgegw.config.errors import ConfigError
from edgegw.config.model import Config
from edgegw.config.parse import load_config

GATEWAY = """\
apiVersion: v1
kind: Gateway
metadata: {name: gw}
spec:
  listen: "127.0.0.1:0"
"""


def write_tree(root: str, files: Mapping[str, str]) -> str:
    """
    Write C{files} (name -> YAML text, dedented) under C{root}; return C{root}.
    """
    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(textwrap.dedent(text))
    return root


def load_text(
    root: str, text: str, environ: Mapping[str, str] | None = None, gateway: bool = True
) -> Config:
    """
    Load one file made of C{text} (with a default Gateway document unless told not to).
    """
    body = textwrap.dedent(text)
    if gateway:
        body = GATEWAY + "---\n" + body
    write_tree(root, {"config.yaml": body})
    return load_config(os.path.join(root, "config.yaml"), environ or {})


def problems_of(
    root: str, text: str, environ: Mapping[str, str] | None = None, gateway: bool = True
) -> list[str]:
    """
    The problems, as strings without the file prefix, that loading C{text} reports.
    """
    try:
        load_text(root, text, environ, gateway)
    except ConfigError as e:
        prefix = os.path.join(root, "config.yaml") + ", "
        return [str(p).removeprefix(prefix) for p in e.problems]
    raise AssertionError("expected a ConfigError")
