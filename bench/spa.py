"""
The single-page app C{python -m bench pageload} loads: n8n's editor (the npm package
C{n8n-editor-ui}, its prebuilt C{dist/}), fetched once with C{npm pack} and kept in
C{bench/.cache/spa/} (git-ignored).

Why this one: it is a real production build of a large Vue app made with Vite, of the
kind edgegw stands in front of, and it is shipped prebuilt on npm. Its first load asks
for about 250 files (99 C{modulepreload}s in C{index.html}, then the chunks they import,
CSS, fonts and images), 7.4 MB uncompressed: many requests at once, which is where
HTTP/1.1's six connections per host and HTTP/2's one multiplexed connection differ, and
text that compresses well, which is where gzip matters. The package is n8n's, under its
own licence; the harness only downloads it to serve it locally and never commits it.

n8n's server fills in placeholders of C{index.html} and C{static/base-path.js} when it
serves them (its base path, a CSP nonce, configuration tags); the harness fills them in
once, for an app at C{/}, as n8n would. The app then asks its API (C{/rest/...}), which
is not there: every server answers those with the app's C{index.html} (the SPA
fallback), and the app shows its error state. What is measured happens before: the load
event, and the app's first render (L{MOUNT}).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "n8n-editor-ui"
"""The npm package."""
VERSION = "2.41.0"
"""Its version, pinned so that every run loads the same files."""
MOUNT = "#app"
"""Where the app renders: the first element put into it is its first render."""
CACHE = Path(__file__).resolve().parent / ".cache" / "spa"
"""Where the package is kept between runs (git-ignored)."""

_PATCHES = {
    "index.html": (
        ("/{{BASE_PATH}}/", "/"),
        (' nonce="{{CSP_NONCE}}"', ""),
        ("%CONFIG_TAGS%", ""),
    ),
    "static/base-path.js": (("'/{{BASE_PATH}}/'", "'/'"),),
}


class SpaError(Exception):
    """The app could not be fetched; the message says why."""


def root(npm: str) -> Path:
    """
    The app's directory (its C{index.html} and assets), fetched with C{npm pack} into
    L{CACHE} on first use.

    @raise SpaError: If npm cannot fetch it or it is not what was expected.
    """
    home = CACHE / f"{PACKAGE}-{VERSION}"
    dist = home / "dist"
    ready = home / ".ready"
    if ready.exists():
        return dist
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="edgegw-bench-spa-") as tmp:
        argv = [npm, "pack", f"{PACKAGE}@{VERSION}", "--silent", "--pack-destination", tmp]
        print(f"bench: fetching {PACKAGE}@{VERSION} with npm pack ...", flush=True)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            raise SpaError(
                f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[-500:]}"
            )
        with tarfile.open(tarballs[0]) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith("package/dist/")]
            archive.extractall(home, members=members, filter="data")
    (home / "package" / "dist").rename(dist)
    shutil.rmtree(home / "package")
    for name, replacements in _PATCHES.items():
        path = dist / name
        if not path.exists():
            raise SpaError(f"{PACKAGE}@{VERSION} has no dist/{name}")
        text = path.read_text()
        for old, new in replacements:
            text = text.replace(old, new)
        path.write_text(text)
    ready.write_text(f"{PACKAGE}@{VERSION}\n")
    return dist


def summary(dist: Path) -> tuple[int, int]:
    """How many files the app has and their total size in bytes."""
    files = [path for path in dist.rglob("*") if path.is_file()]
    return len(files), sum(path.stat().st_size for path in files)
