"""
edgegw's benchmark harness: C{python -m bench proxy|memory|api|authz|telemetry}.

Benchmarks run real processes on loopback and are never part of the test suite; see
C{bench/README.md} for what each command measures and how to read its numbers.
"""
