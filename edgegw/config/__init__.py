"""Configuration: YAML resources loaded, interpolated, validated and frozen at startup."""

from edgegw.config.errors import ConfigError, Problem
from edgegw.config.model import Config

__all__ = ["Config", "ConfigError", "Problem"]
