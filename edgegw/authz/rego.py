"""
Rego policies: compiled once when the gateway is built, evaluated per request.

A policy's C{rego.path} is a C{.rego} file or a directory of them (read in lexical
order). Every file must declare C{package gw.authz}, and together they must define
C{deny}. The query is always C{data.gw.authz.deny} (a rule that evaluates to false
answers "undefined" rather than false, so asking for an C{allow} would be ambiguous):

- undefined, or an empty set: allow;
- a non-empty set (or array) of strings: deny, the strings being the reasons;
- anything else, or an evaluation error (built-in errors are strict): deny.

rego-cpp runs native code; its results are read only through their JSON text, never
through accessors that assume a shape (an out-of-range access there aborts the process).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from regopy import Input, Interpreter

ENTRYPOINT = "gw/authz/deny"
EVALUATION_ERROR = "evaluation error"
"""The deny reason of a failed evaluation (fail closed)."""
_PACKAGE = re.compile(r"\A(?:\s|#[^\n]*\n)*package\s+gw\.authz\s*(?:#[^\n]*)?$", re.MULTILINE)
_DENY_RULE = re.compile(r"^[ \t]*(?:default[ \t]+)?deny\b", re.MULTILINE)
# Built-ins whose result is not a function of the input alone (the clock, randomness, the
# network, certificate validity, tracing): a policy that names one is evaluated on every
# request. Matched in the whole text, comments included, and with any whitespace Rego
# allows inside a reference (time . now_ns), which can only make a policy evaluated more
# often; remembered decisions also expire (edgegw.authz.policy).
_IMPURE = re.compile(
    r"\b(?:time|rand|uuid|net|opa)\s*\."
    r"|\bhttp\s*\.\s*send\b"
    r"|\bio\s*\.\s*jwt\s*\.\s*decode_verify\b"
    r"|\bcrypto\s*\.\s*x509\s*\.\s*parse_and_verify"
    r"|\btrace\s*\("
)
_PROBE: dict[str, Any] = {
    "subject": "",
    "groups": [],
    "claims": {},
    "request": {"method": "GET", "path": "/", "route": "", "route_name": "", "labels": {}},
}


class RegoLoadError(Exception):
    """
    A Rego policy cannot be used; C{str(e)} names the file and the problem.
    """


def rego_files(path: str) -> list[str]:
    """
    The C{.rego} files at C{path} (a file, or a directory read in lexical order).

    @raise RegoLoadError: Missing path, or a directory without C{.rego} files.
    """
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, name)
            for name in os.listdir(path)
            if name.endswith(".rego") and os.path.isfile(os.path.join(path, name))
        )
        if not files:
            raise RegoLoadError(f"{path}: no .rego files in this directory")
        return files
    if not os.path.isfile(path):
        raise RegoLoadError(f"{path}: no such file or directory")
    return [path]


class RegoPolicy:
    """
    One compiled Rego policy.

    @ivar pure: Whether its decision depends on the input alone (it names none of the
        built-ins that read the clock, randomness or the network): then a decision may
        be remembered for the same input (L{edgegw.authz.policy.RoutePolicies}).
    @raise RegoLoadError: On unreadable files, syntax errors, a package other than
        C{gw.authz}, or no C{deny} rule (or one that is not a set).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.interpreter = Interpreter()
        self.interpreter.strict_built_in_errors = True
        has_deny = False
        self.pure = True
        for file in rego_files(path):
            try:
                with open(file, encoding="utf-8") as stream:
                    source = stream.read()
            except (OSError, UnicodeDecodeError) as e:
                raise RegoLoadError(f"{file}: cannot read: {e}") from None
            if not _PACKAGE.search(source):
                raise RegoLoadError(f"{file}: the package must be gw.authz")
            has_deny = has_deny or bool(_DENY_RULE.search(source))
            self.pure = self.pure and not _IMPURE.search(source)
            try:
                self.interpreter.add_module(os.path.basename(file), source)
            except Exception as e:  # RegoError, or anything else the library raises
                raise RegoLoadError(f"{file}: {_first_line(e)}") from None
        try:
            self.bundle = self.interpreter.build(None, [ENTRYPOINT])
        except Exception as e:
            raise RegoLoadError(f"{path}: {_first_line(e)}") from None
        if not has_deny:
            raise RegoLoadError(f"{path}: no deny rule in package gw.authz")
        # The probe (an anonymous GET /) checks the shape of deny; it may well be undefined
        # there (a rule with conditions), which says nothing either way.
        probe = self._query(_PROBE)
        # An evaluation error here may depend on the input; only a defined result of the
        # wrong type is certain.
        if probe is not None and probe is not _ERROR and not isinstance(probe, list):
            raise RegoLoadError(f"{path}: deny must be a set of strings")

    def _query(self, document: Mapping[str, Any]) -> Any:
        interpreter = self.interpreter
        try:
            interpreter.set_input(Input(document))
            output = interpreter.query_bundle_entrypoint(self.bundle, ENTRYPOINT)
            if not output.ok():
                return _ERROR
            text = str(output)
        except Exception:
            # RegoError, and anything else the native library raises (it has been seen
            # raising JSONDecodeError on its own output): fail closed.
            return _ERROR
        if text == "undefined":
            return None
        try:
            expressions = json.loads(text)["expressions"]
            return expressions[0] if len(expressions) == 1 else _ERROR
        except (ValueError, KeyError, TypeError):
            return _ERROR

    def evaluate(self, document: Mapping[str, Any]) -> list[str] | None:
        """
        The deny reasons for C{document} (the input), or L{None} when allowed.

        Fails closed: an evaluation error or a result of the wrong type is a denial.
        """
        result = self._query(document)
        if result is None or result == []:
            return None
        if result is _ERROR:
            return [EVALUATION_ERROR]
        if not isinstance(result, list) or not all(isinstance(item, str) for item in result):
            return ["deny is not a set of strings"]
        return [str(item) for item in result]


_ERROR = object()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return " ".join(text.split("\n")[:3]) if text else type(error).__name__
