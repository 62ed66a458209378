"""Packaging for edgegw, an HTTP edge gateway on Twisted."""

from setuptools import find_packages, setup

setup(
    name="edgegw",
    version="0.1.0",
    description="HTTP edge gateway: static SPA hosting, streaming proxy, API fan-out, OIDC",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["edgegw", "edgegw.*"]) + ["twisted.plugins"],
    package_data={"edgegw": ["py.typed"], "twisted.plugins": ["edgegw_plugin.py"]},
    # What edgegw/ and twisted/plugins/ import (or, for service-identity, rely on: Twisted
    # verifies upstream certificates' host names with it, and a mismatch surfaces as its
    # VerificationError). Lower bounds are the versions in tests/constraints-oldest.txt,
    # on which `make test` runs the trial suite a second time; upper bounds stop below the
    # next major version no test has run on yet. Why a lower bound is not lower:
    #   Twisted 26.4: upstream/upstreams.py's insecureSkipVerify TLS calls
    #     CertificateOptions.clientConnectionForTLS, new in 26.4 (also < 24.10: NUL in a
    #     header value is not refused; < 24.7: writeHeaders is not given a Headers).
    #   pyOpenSSL 25.2: what Twisted 26.4's tls extra requires.
    #   PyJWT 2.10.1: 2.10.0 compared the issuer as a substring (CVE-2024-53861).
    #   cryptography 45.0.7: what pyOpenSSL 25.2 pulls in at its lowest; AESGCM and every
    #     key type the IdP key sets use are older.
    #   txredisapi 1.6.0: the first that connects through an endpoint it is given
    #     (RedisFactory.startConnecting), so state/kvstore.py hands it TLS from
    #     optionsForClientTLS over a HostnameEndpoint on the gateway's reactor, and whose
    #     pool slots reconnect through ClientService with capped backoff; 1.5.0 and older
    #     dial reactor.connectTCP/connectSSL themselves with a ReconnectingClientFactory
    #     (1.4.7 and older cannot AUTH with a user name either, for Redis 6 ACL users).
    #   h2 4.1: HTTP/2 for browsers (edgegw/server/h2/); 4.1 is the first release of the
    #     4.x line whose frame and HPACK limits (max_inbound_frame_size, the decoder's
    #     max_header_list_size) the server sets, on hpack 4 and hyperframe 6.
    #   brotli 1.1 and zstandard 0.21: response compression (edgegw/compression/); the
    #     first releases with wheels for Python 3.11 (no compiler needed to install them).
    #   opentelemetry 1.35: before it, the OTLP/gRPC exporter's User-Agent does not reach
    #     the collector when headers are configured (gRPC replaces it; test_otlp_support).
    # Twisted private names the code relies on: docs/architecture.md, "Twisted private
    # names we rely on".
    install_requires=[
        "Twisted[tls]>=26.4,<27",
        "pyOpenSSL>=25.2,<27",
        "service-identity>=24.1,<27",
        "attrs>=23.1,<27",
        "zope.interface>=6.0,<9",
        "PyYAML>=6.0,<7",
        "regopy>=1.5.1,<2",
        "treq>=23.11,<27",
        "hyperlink>=21.0,<22",
        "cryptography>=45.0.7,<51",
        "PyJWT>=2.10.1,<3",
        "PyNaCl>=1.5.0,<2",
        "txredisapi>=1.6.0,<2",
        "h2>=4.1,<5",
        "brotli>=1.1,<2",
        "zstandard>=0.21,<1",
        "opentelemetry-api>=1.35,<2",
        "opentelemetry-sdk>=1.35,<2",
        "opentelemetry-exporter-otlp-proto-http>=1.35,<2",
        "opentelemetry-exporter-otlp-proto-grpc>=1.35,<2",
    ],
    extras_require={
        "test": [
            # Imported by the tests (tests/constraints-oldest.txt pins its lower bound too).
            "wsproto>=1.2,<2",
            # The end-to-end suite's browser (tests/e2e/browser.py) drives Debian's
            # chromium through its chromium-driver; 4.11: Service(log_output=).
            "selenium>=4.11,<5",
            # Tools, run in .venv only.
            "import-linter>=2.1,<3",
            "mypy>=1.10,<2.5",
            "mypy-zope>=1.0.17,<2",
            "ruff>=0.5,<0.18",
            "types-PyYAML>=6.0,<7",
        ],
    },
    entry_points={
        "console_scripts": ["edgegw=edgegw.__main__:main"],
        # State providers (edgegw/state/providers.py): registered as any other package would.
        "edgegw.state_providers": ["kvstore = edgegw.state.kvstore:provider"],
        # Request and response plugins (edgegw/plugins/registry.py), likewise.
        "edgegw.plugins": [
            "headers = edgegw.plugins.headers:plugin",
            "body-limit = edgegw.plugins.body_limit:plugin",
            "rate-limit = edgegw.plugins.rate_limit:plugin",
        ],
    },
    zip_safe=False,
)
