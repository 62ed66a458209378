"""
The Prometheus text exposition format (version 0.0.4) of a L{Registry}, named as the
OpenTelemetry-to-Prometheus compatibility rules name metrics: dots and other invalid
characters become C{_}, the unit becomes a suffix (C{s} -> C{_seconds}, C{By} ->
C{_bytes}; annotations in braces are dropped), monotonic sums end in C{_total}, and the
resource attributes are the labels of one C{target_info} series.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from io import BytesIO
from typing import Any

from twisted.logger import Logger
from twisted.protocols.basic import FileSender
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.metrics.instruments import Counter, Histogram, HistogramPoint, Observable, Registry

__all__ = ["CONTENT_TYPE", "MetricsPage", "metric_name", "render", "target_labels"]

_log = Logger(namespace="edgegw.metrics")

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

ONE_WRITE = 64 * 1024
"""The largest scrape page written at once; a bigger one goes out in chunks."""

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")
_UNITS = {
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "%": "percent",
}


def metric_name(name: str, unit: str, kind: str) -> str:
    """
    The Prometheus name of an OpenTelemetry metric C{name} in C{unit}; C{kind} is
    C{counter}, C{gauge} or C{histogram}.
    """
    base = _INVALID.sub("_", name)
    suffix = "" if unit.startswith("{") else _UNITS.get(unit, _INVALID.sub("_", unit))
    if unit == "1":
        suffix = "ratio" if kind == "gauge" else ""
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if kind == "counter" and not base.endswith("_total"):
        base += "_total"
    return re.sub("_+", "_", base)


def label_name(name: str) -> str:
    """
    The Prometheus label name of an attribute.
    """
    label = _INVALID_LABEL.sub("_", name)
    return "_" + label if label[:1].isdigit() else label


def target_labels(resource: Mapping[str, Any]) -> dict[str, Any]:
    """
    C{resource}'s attributes as C{target_info}'s labels: the first of several
    attributes whose label names are the same (C{deployment.environment} and
    C{deployment_environment}) is kept, as Prometheus refuses a whole scrape with a
    label twice.
    """
    labels: dict[str, Any] = {}
    for name, value in resource.items():
        labels.setdefault(label_name(name), value)
    return labels


def _clashing(resource: Mapping[str, Any]) -> list[str]:
    """
    The attributes of C{resource} whose label name another attribute has too.
    """
    by_label: dict[str, list[str]] = {}
    for name in resource:
        by_label.setdefault(label_name(name), []).append(name)
    return sorted(name for names in by_label.values() if len(names) > 1 for name in names)


def _escape(value: object) -> str:
    if value is True or value is False:
        value = str(value).lower()
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    # HELP text escapes backslashes and line feeds only (a quote stays a quote).
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _labels(names: Iterable[str], values: Iterable[object], extra: str = "") -> str:
    pairs = [f'{label_name(n)}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _kind(instrument: object) -> str:
    if isinstance(instrument, Histogram):
        return "histogram"
    if isinstance(instrument, Counter):
        return "counter" if instrument.monotonic else "gauge"
    if isinstance(instrument, Observable):
        return "counter" if instrument.kind == "counter" else "gauge"
    raise TypeError(f"not an instrument: {instrument!r}")


def render(registry: Registry, resource: Mapping[str, Any]) -> bytes:
    """
    The registry's series now, with C{target_info} carrying C{resource}.
    """
    target = target_labels(resource)
    lines = [
        "# HELP target_info Target metadata",
        "# TYPE target_info gauge",
        f"target_info{_labels(target.keys(), target.values())} 1",
    ]
    for instrument in registry.instruments:
        kind = _kind(instrument)
        name = metric_name(instrument.name, instrument.unit, kind)
        lines.append(f"# HELP {name} {_escape_help(instrument.description)}")
        lines.append(f"# TYPE {name} {kind}")
        for names, values, value in instrument.points():
            if isinstance(value, HistogramPoint):
                base = name
                cumulative = 0
                for bound, count in zip(value.bounds, value.counts, strict=False):
                    cumulative += count
                    le = f'le="{_number(bound)}"'
                    lines.append(f"{base}_bucket{_labels(names, values, le)} {cumulative}")
                labels = _labels(names, values)
                le = 'le="+Inf"'
                lines.append(f"{base}_bucket{_labels(names, values, le)} {value.count}")
                lines.append(f"{base}_sum{labels} {_number(value.sum)}")
                lines.append(f"{base}_count{labels} {value.count}")
            else:
                assert isinstance(value, int | float)
                lines.append(f"{name}{_labels(names, values)} {_number(value)}")
    lines.append("")
    return "\n".join(lines).encode("utf-8")


class MetricsPage(Resource):
    """
    C{GET} (and C{HEAD}) the registry in the Prometheus text format.
    """

    isLeaf = True

    def __init__(self, registry: Registry, resource: Mapping[str, Any]) -> None:
        super().__init__()
        self.registry = registry
        self.resource = dict(resource)
        clashing = _clashing(resource)
        if clashing:
            _log.warn(
                "resource attributes {names} share Prometheus label names: target_info"
                " keeps the first of each",
                names=", ".join(clashing),
            )

    def render_GET(self, request: Request) -> bytes | int:
        request.setHeader(b"Content-Type", CONTENT_TYPE)
        request.setHeader(b"Cache-Control", b"no-store")
        body = render(self.registry, self.resource)
        request.setHeader(b"Content-Length", b"%d" % len(body))
        if request.method == b"HEAD":
            # Twisted would log each HEAD that returns a body, as if it were a mistake.
            return b""
        if len(body) <= ONE_WRITE:
            return body
        # In one write a big page would sit whole in the transport's buffer, which
        # tells the channel it drained only once empty: the scrape site's send timeout
        # would cut a slow but steady scraper. Sent in chunks, each one read counts.
        sending = FileSender().beginFileTransfer(BytesIO(body), request)
        sending.addCallbacks(lambda _: request.finish(), lambda _: None)
        return NOT_DONE_YET

    render_HEAD = render_GET
