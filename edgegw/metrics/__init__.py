"""
Metrics: instruments the gateway records into on its hot path, read by a Prometheus
scrape (L{edgegw.metrics.prometheus}) and by a periodic OTLP export through the
OpenTelemetry SDK's exporter (L{edgegw.metrics.otlp}).

Built only with a C{metrics} block in the C{Telemetry} resource; without one the
gateway holds no L{GatewayMetrics<edgegw.metrics.gateway_metrics.GatewayMetrics>} and records
nothing.
"""
