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
    install_requires=[
        "Twisted[tls]>=24.3,<27",
        "attrs>=23.1,<27",
        "treq>=23.11,<27",
        "regopy>=1.5,<2",
        "opentelemetry-sdk>=1.25,<2",
        "opentelemetry-exporter-otlp-proto-http>=1.25,<2",
        "opentelemetry-exporter-otlp-proto-grpc>=1.25,<2",
        "PyYAML>=6.0,<7",
        "zope.interface>=6.0,<9",
    ],
    extras_require={
        "test": [
            "import-linter>=2.1,<3",
            "mypy>=1.10,<2.5",
            "mypy-zope>=1.0.17,<2",
            "ruff>=0.5,<0.18",
            "types-PyYAML>=6.0,<7",
            "wsproto>=1.2,<2",
        ],
    },
    entry_points={"console_scripts": ["edgegw=edgegw.__main__:main"]},
    zip_safe=False,
)
