"""
The gateway's own metric instruments: counters, up-down counters and histograms that
aggregate in place, keyed by a tuple of attribute values, and observable instruments
read by a callback at collection.

Why not the OpenTelemetry SDK's instruments: recording into one costs about 5 µs
(attributes hashed as a frozen set, a lock, a view lookup) and a proxied request records
five or six values, which alone would be most of the +10 % the metrics may cost. Here
a record is a dictionary lookup on a tuple the caller built and an addition (under
1 µs); the SDK's data model and OTLP exporter still carry the result out
(L{edgegw.metrics.otlp}). Everything runs in the reactor thread, so nothing is locked.

Cardinality is bounded twice: the callers only ever pass bounded values (route
patterns, methods folded to a known set, status classes, configured names), and each
instrument keeps at most C{limit} series, folding any further ones into one series with
the attribute C{otel.metric.overflow=true}, as the OpenTelemetry SDK does.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, cast

import attrs

__all__ = [
    "DEFAULT_CARDINALITY_LIMIT",
    "OVERFLOW",
    "Counter",
    "Histogram",
    "HistogramPoint",
    "Instrument",
    "Observable",
    "Registry",
]

DEFAULT_CARDINALITY_LIMIT = 2000
"""Series one instrument keeps before folding new ones into the overflow series."""

OVERFLOW = ("otel.metric.overflow",)
"""The attribute names of the overflow series (its one value is C{True})."""

Attributes = tuple[object, ...]
"""Attribute values, in the order of the instrument's C{attribute_names}."""

_OVERFLOW_KEY: Attributes = (object(),)
"""The key of an instrument's overflow series (no caller can pass it)."""


@attrs.define(eq=False)
class Instrument:
    """
    What every instrument has: a semantic-convention name, a UCUM unit, a description
    and the names of its attributes.
    """

    name: str
    unit: str
    description: str
    attribute_names: tuple[str, ...]

    def points(self) -> Iterable[tuple[tuple[str, ...], Attributes, object]]:
        """
        The current series: (attribute names, attribute values, value).
        """
        raise NotImplementedError


@attrs.define(eq=False)
class Counter(Instrument):
    """
    A sum: monotonic (a counter) or not (an up-down counter, such as requests in
    flight).
    """

    monotonic: bool = True
    limit: int = DEFAULT_CARDINALITY_LIMIT
    _values: dict[Attributes, float] = attrs.field(factory=dict)

    def add(self, amount: float, attributes: Attributes = ()) -> None:
        """
        Add C{amount} to the series C{attributes}.
        """
        values = self._values
        if attributes in values:
            values[attributes] += amount
        elif len(values) < self.limit:
            values[attributes] = amount
        else:
            values[_OVERFLOW_KEY] = values.get(_OVERFLOW_KEY, 0) + amount

    def declare(self, attributes: Attributes = ()) -> None:
        """
        Start the series C{attributes} at 0 so that it is exported before anything is
        counted in it, when the limit has room for it (never into the overflow series).
        """
        values = self._values
        if attributes not in values and len(values) < self.limit:
            values[attributes] = 0

    def value(self, attributes: Attributes = ()) -> float:
        """
        The series' current value (0 when it was never recorded).
        """
        return self._values.get(attributes, 0)

    def points(self) -> Iterable[tuple[tuple[str, ...], Attributes, object]]:
        for attributes, value in list(self._values.items()):
            yield _labelled(self, attributes, value)


class HistogramPoint:
    """
    One histogram series: bucket counts (C{counts[i]} for values up to C{bounds[i]}, the
    last for the rest), count, sum, min and max.
    """

    __slots__ = ("bounds", "count", "counts", "max", "min", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")

    def record(self, value: float) -> None:
        """
        Count C{value} (buckets are upper-inclusive, as Prometheus's C{le}).
        """
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value


@attrs.define(eq=False)
class Histogram(Instrument):
    """
    A distribution with explicit bucket boundaries.
    """

    boundaries: tuple[float, ...] = ()
    limit: int = DEFAULT_CARDINALITY_LIMIT
    _series: dict[Attributes, HistogramPoint] = attrs.field(factory=dict)

    def record(self, value: float, attributes: Attributes = ()) -> None:
        """
        Record C{value} in the series C{attributes}.
        """
        point = self._series.get(attributes)
        if point is None:
            point = self._new(attributes)
        point.record(value)

    def series(self, attributes: Attributes = ()) -> HistogramPoint:
        """
        The series C{attributes} records into (the overflow series past the limit),
        made if need be: for a caller that records into it again without a look-up.
        """
        point = self._series.get(attributes)
        if point is None:
            point = self._new(attributes)
        return point

    def point(self, attributes: Attributes = ()) -> HistogramPoint | None:
        """
        The series C{attributes}, or L{None} when it was never recorded.
        """
        return self._series.get(attributes)

    def _new(self, attributes: Attributes) -> HistogramPoint:
        series = self._series
        if len(series) >= self.limit:
            attributes = _OVERFLOW_KEY
            if attributes in series:
                return series[attributes]
        point = series[attributes] = HistogramPoint(self.boundaries)
        return point

    def points(self) -> Iterable[tuple[tuple[str, ...], Attributes, object]]:
        for attributes, point in list(self._series.items()):
            yield _labelled(self, attributes, point)


ObservableKind = Literal["gauge", "counter", "updowncounter"]


@attrs.define(eq=False)
class Observable(Instrument):
    """
    Values read at collection from a callback: a gauge, or a counter or up-down counter
    whose sum something else keeps (a pool's connections, a writer's dropped lines).
    """

    kind: ObservableKind = "gauge"
    callback: Callable[[], Iterable[tuple[Attributes, float]]] = attrs.field(
        default=lambda: (), repr=False
    )

    def points(self) -> Iterable[tuple[tuple[str, ...], Attributes, object]]:
        for attributes, value in self.callback():
            yield self.attribute_names, attributes, value


def _labelled(
    instrument: Instrument, attributes: Attributes, value: object
) -> tuple[tuple[str, ...], Attributes, object]:
    if attributes is _OVERFLOW_KEY:
        return OVERFLOW, (True,), value
    return instrument.attribute_names, attributes, value


class Registry:
    """
    The instruments of one gateway, in the order they were made, and when it started
    counting (the start of every cumulative series).
    """

    def __init__(
        self, limit: int = DEFAULT_CARDINALITY_LIMIT, carry: Registry | None = None
    ) -> None:
        """
        @param carry: The registry of the gateway this one replaces (a reload): its
            counters and histograms are taken over, so that both gateways count into
            the same series (the old one's requests in flight included) and nothing
            resets; its observables are not (they read the old gateway's objects).
        """
        self.limit = limit
        self.instruments: list[Instrument] = []
        self.start_time_ns: int = time.time_ns() if carry is None else carry.start_time_ns
        self._names: set[str] = set()
        self._carried: dict[str, Instrument] = {}
        self._taken: list[Counter | Histogram] = []
        if carry is not None:
            self._carried = {
                instrument.name: instrument
                for instrument in carry.instruments
                if not isinstance(instrument, Observable)
            }

    def _add(self, instrument: Instrument) -> None:
        if instrument.name in self._names:
            raise ValueError(f"two instruments are named {instrument.name}")
        self._names.add(instrument.name)
        self.instruments.append(instrument)

    def _take_over(self, made: Counter | Histogram) -> Counter | Histogram:
        """
        The carried instrument of C{made}'s name when it is the same instrument (kind,
        unit, attributes, boundaries); else C{made}. Its limit stays the running
        gateway's until L{adopt}.
        """
        carried = self._carried.pop(made.name, None)
        if not isinstance(carried, (Counter, Histogram)) or type(carried) is not type(made):
            return made
        same = (carried.unit, carried.attribute_names) == (made.unit, made.attribute_names)
        if isinstance(made, Histogram):
            same = same and made.boundaries == cast(Histogram, carried).boundaries
        else:
            same = same and made.monotonic == cast(Counter, carried).monotonic
        if not same:
            return made
        self._taken.append(carried)
        return carried

    def adopt(self) -> None:
        """
        Apply this registry's cardinality limit to the instruments it carried over:
        called when its gateway takes over, since a reload refused after the build must
        leave the running gateway's limit as it was.
        """
        for instrument in self._taken:
            instrument.limit = self.limit

    def counter(
        self,
        name: str,
        unit: str,
        description: str,
        attribute_names: Sequence[str] = (),
        monotonic: bool = True,
    ) -> Counter:
        """
        A new L{Counter} (an up-down counter unless C{monotonic}), or the carried one of
        that name.
        """
        counter = Counter(
            name, unit, description, tuple(attribute_names), monotonic=monotonic, limit=self.limit
        )
        counter = cast(Counter, self._take_over(counter))
        self._add(counter)
        return counter

    def histogram(
        self,
        name: str,
        unit: str,
        description: str,
        attribute_names: Sequence[str],
        boundaries: Sequence[float],
    ) -> Histogram:
        """
        A new L{Histogram} with these bucket boundaries (ascending), or the carried one
        of that name.
        """
        histogram = Histogram(
            name,
            unit,
            description,
            tuple(attribute_names),
            boundaries=tuple(boundaries),
            limit=self.limit,
        )
        histogram = cast(Histogram, self._take_over(histogram))
        self._add(histogram)
        return histogram

    def observable(
        self,
        name: str,
        unit: str,
        description: str,
        attribute_names: Sequence[str],
        callback: Callable[[], Iterable[tuple[Attributes, float]]],
        kind: ObservableKind = "gauge",
    ) -> Observable:
        """
        A new L{Observable} read through C{callback} at each collection.
        """
        observable = Observable(
            name, unit, description, tuple(attribute_names), kind=kind, callback=callback
        )
        self._add(observable)
        return observable
