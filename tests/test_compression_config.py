"""
The configuration of compression: C{Gateway.spec.compression} (its defaults, each field
read, its errors), a handler's C{compress} and a static handler's C{precompressed}; each
error names the file, the resource and the field, and C{edgegw check} refuses them.
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Mapping

from twisted.trial.unittest import SynchronousTestCase

from edgegw.check import check
from edgegw.config.errors import ConfigError
from edgegw.config.model import (
    ApiHandlerSpec,
    CompressionSpec,
    Config,
    HandlerSpec,
    HealthHandlerSpec,
    ProxyHandlerSpec,
    StaticHandlerSpec,
)
from edgegw.config.parse import load_config
from tests.support.configs import GATEWAY, write_tree

DEFAULT_TYPES = (
    "text/*",
    "application/json",
    "application/javascript",
    "application/xml",
    "application/manifest+json",
    "image/svg+xml",
    "application/wasm",
)
GATEWAY_RESOURCE = 'document 1, Gateway "gw"'
ROUTE_RESOURCE = 'document 2, Route "r"'
EXPECTED_CODINGS = "(expected one of zstd, br, gzip)"

# One route of each handler type, with the YAML lines of {extra} added to its handler.
HANDLERS = {
    "static": '{{type: static, dir: ".", {extra}}}',
    "reverse-proxy": '{{type: reverse-proxy, upstream: "http://127.0.0.1:9", {extra}}}',
    "api": (
        '{{type: api, backends: [{{group: g, upstream: "http://127.0.0.1:9", path: /x}}], {extra}}}'
    ),
    "health": "{{type: health, {extra}}}",
}


def route(handler: str) -> str:
    """
    A Route document named C{r} on C{/r/} with C{handler} (a YAML flow mapping).
    """
    return f"kind: Route\nmetadata: {{name: r}}\nspec:\n  match: /r/\n  handler: {handler}\n"


def gateway(block: str) -> str:
    """
    The Gateway document with C{block} (YAML lines, not indented) added to its spec.
    """
    return GATEWAY + textwrap.indent(textwrap.dedent(block), "  ")


class CompressionConfigTestCase(SynchronousTestCase):
    """
    Load configurations written to one file, C{config.yaml}.
    """

    def write(self, text: str) -> str:
        """
        Write C{text} as C{config.yaml} in a new directory; return the file's path.
        """
        root = write_tree(self.mktemp(), {"config.yaml": text})
        return os.path.join(root, "config.yaml")

    def load(self, text: str, environ: Mapping[str, str] | None = None) -> Config:
        """
        The configuration C{text} (whole documents) loads to.
        """
        return load_config(self.write(text), dict(environ or {}))

    def problems(self, text: str) -> list[str]:
        """
        The problems loading C{text} reports, each as printed: file, resource, field.
        """
        return self.problems_at(self.write(text))

    def problems_at(self, path: str) -> list[str]:
        """
        The problems loading the file at C{path} reports, each as printed.
        """
        try:
            load_config(path, {})
        except ConfigError as e:
            return [str(problem) for problem in e.problems]
        self.fail(f"expected a ConfigError from {path}")

    def assertProblems(self, text: str, expected: list[tuple[str, str, str]]) -> None:
        """
        Loading C{text} reports exactly C{expected}: (resource, field, message), each
        located in the file.
        """
        path = self.write(text)
        found = self.problems_at(path)
        self.assertEqual(
            found,
            [f"{path}, {resource}: {field}: {message}" for resource, field, message in expected],
        )

    def compression(self, block: str, environ: Mapping[str, str] | None = None) -> CompressionSpec:
        """
        The compression spec a Gateway with C{block} in its spec loads to.
        """
        return self.load(gateway(block), environ).gateway.compression


class DefaultsTests(CompressionConfigTestCase):
    """
    C{Gateway.spec.compression}'s defaults, and each field read on its own.
    """

    def test_defaults_without_a_block(self) -> None:
        spec = self.load(GATEWAY).gateway.compression
        self.assertTrue(spec.enabled)
        self.assertEqual(spec.encodings, ("zstd", "br", "gzip"))
        self.assertEqual(spec.min_size, 1024)
        self.assertEqual(spec.types, DEFAULT_TYPES)

    def test_empty_block_and_null_fields_are_the_defaults(self) -> None:
        defaults = self.load(GATEWAY).gateway.compression
        self.assertEqual(self.compression("compression: {}\n"), defaults)
        self.assertEqual(
            self.compression(
                "compression: {enabled: null, encodings: null, minSize: null, types: null}\n"
            ),
            defaults,
        )

    def test_enabled(self) -> None:
        spec = self.compression("compression: {enabled: false}\n")
        self.assertFalse(spec.enabled)
        self.assertEqual(
            (spec.encodings, spec.min_size, spec.types),
            (("zstd", "br", "gzip"), 1024, DEFAULT_TYPES),
        )
        self.assertTrue(self.compression("compression: {enabled: true}\n").enabled)

    def test_encodings_in_the_order_given(self) -> None:
        spec = self.compression("compression: {encodings: [gzip, br]}\n")
        self.assertEqual(spec.encodings, ("gzip", "br"))
        self.assertEqual((spec.enabled, spec.min_size, spec.types), (True, 1024, DEFAULT_TYPES))
        self.assertEqual(self.compression("compression: {encodings: [br]}\n").encodings, ("br",))

    def test_min_size(self) -> None:
        spec = self.compression("compression: {minSize: 0}\n")
        self.assertEqual(spec.min_size, 0)
        self.assertEqual(spec.encodings, ("zstd", "br", "gzip"))
        self.assertEqual(self.compression("compression: {minSize: 65536}\n").min_size, 65536)

    def test_types(self) -> None:
        spec = self.compression(
            'compression: {types: [text/html, "application/*", image/svg+xml]}\n'
        )
        self.assertEqual(spec.types, ("text/html", "application/*", "image/svg+xml"))
        self.assertEqual((spec.enabled, spec.min_size), (True, 1024))

    def test_types_lowercased(self) -> None:
        spec = self.compression('compression: {types: ["Text/HTML", " application/JSON "]}\n')
        self.assertEqual(spec.types, ("text/html", "application/json"))

    def test_from_environment_variables(self) -> None:
        spec = self.compression(
            'compression: {enabled: "${ON}", minSize: "${MIN}"}\n', {"ON": "false", "MIN": "2048"}
        )
        self.assertEqual((spec.enabled, spec.min_size), (False, 2048))


class HandlerFieldTests(CompressionConfigTestCase):
    """
    C{compress} on every handler type, C{precompressed} on C{static}.
    """

    def handler(self, type_: str, extra: str = "") -> HandlerSpec:
        """
        The handler of a route of type C{type_} with the YAML fields C{extra}.
        """
        config = self.load(GATEWAY + "---\n" + route(HANDLERS[type_].format(extra=extra)))
        [spec] = config.routes
        return spec.handler

    def test_compress_defaults_to_true(self) -> None:
        for type_, spec_type in (
            ("static", StaticHandlerSpec),
            ("reverse-proxy", ProxyHandlerSpec),
            ("api", ApiHandlerSpec),
            ("health", HealthHandlerSpec),
        ):
            handler = self.handler(type_)
            assert isinstance(handler, spec_type)
            self.assertIs(handler.compress, True, type_)

    def test_compress_false_on_every_handler_type(self) -> None:
        for type_ in HANDLERS:
            handler = self.handler(type_, "compress: false")
            self.assertIs(handler.compress, False, type_)

    def test_precompressed(self) -> None:
        default = self.handler("static")
        assert isinstance(default, StaticHandlerSpec)
        self.assertEqual(default.precompressed, ("br", "zstd", "gzip"))
        for listed, expected in (
            ("[]", ()),
            ("[gzip]", ("gzip",)),
            ("[gzip, zstd, br]", ("gzip", "zstd", "br")),
            ("null", ("br", "zstd", "gzip")),
        ):
            handler = self.handler("static", f"precompressed: {listed}")
            assert isinstance(handler, StaticHandlerSpec)
            self.assertEqual(handler.precompressed, expected, listed)


class CompressionBlockErrorTests(CompressionConfigTestCase):
    """
    Each mistake in C{Gateway.spec.compression} is reported at its field, all together.
    """

    def assertGatewayProblems(self, block: str, expected: list[tuple[str, str]]) -> None:
        self.assertProblems(
            gateway(block),
            [
                (GATEWAY_RESOURCE, f"spec.compression.{field}", message)
                for field, message in expected
            ],
        )

    def test_unknown_encoding_with_did_you_mean(self) -> None:
        self.assertGatewayProblems(
            "compression: {encodings: [gzp, zstdd, bro, deflate, x-gzip]}\n",
            [
                (
                    "encodings[0]",
                    f'unknown encoding "gzp"; did you mean "gzip"? {EXPECTED_CODINGS}',
                ),
                (
                    "encodings[1]",
                    f'unknown encoding "zstdd"; did you mean "zstd"? {EXPECTED_CODINGS}',
                ),
                ("encodings[2]", f'unknown encoding "bro"; did you mean "br"? {EXPECTED_CODINGS}'),
                ("encodings[3]", f'unknown encoding "deflate" {EXPECTED_CODINGS}'),
                (
                    "encodings[4]",
                    f'unknown encoding "x-gzip"; did you mean "gzip"? {EXPECTED_CODINGS}',
                ),
            ],
        )

    def test_duplicate_encoding(self) -> None:
        self.assertGatewayProblems(
            "compression: {encodings: [gzip, br, gzip, br]}\n",
            [
                ("encodings[2]", '"gzip" is listed twice'),
                ("encodings[3]", '"br" is listed twice'),
            ],
        )

    def test_empty_encodings(self) -> None:
        self.assertGatewayProblems(
            "compression: {encodings: []}\n", [("encodings", "must not be an empty list")]
        )

    def test_encodings_not_a_list(self) -> None:
        self.assertGatewayProblems(
            "compression: {encodings: gzip}\n",
            [("encodings", "expected a list of strings, got a string")],
        )

    def test_min_size_negative(self) -> None:
        self.assertGatewayProblems(
            "compression: {minSize: -1}\n", [("minSize", "must be at least 0, got -1")]
        )

    def test_min_size_not_an_integer(self) -> None:
        for value, kind in (('"1024"', "a string"), ("1.5", "a number"), ("true", "a boolean")):
            self.assertGatewayProblems(
                f"compression: {{minSize: {value}}}\n",
                [("minSize", f"expected an integer, got {kind}")],
            )

    def test_types_not_media_types(self) -> None:
        not_a_type = 'is not a media type such as "application/json" or "text/*" (no parameters)'
        self.assertGatewayProblems(
            'compression: {types: [text, "text/", "/html", "text/html; charset=utf-8", '
            '"text/html;q=1", "text/*/x"]}\n',
            [
                ("types[0]", f'"text" {not_a_type}'),
                ("types[1]", f'"text/" {not_a_type}'),
                ("types[2]", f'"/html" {not_a_type}'),
                ("types[3]", f'"text/html; charset=utf-8" {not_a_type}'),
                ("types[4]", f'"text/html;q=1" {not_a_type}'),
                ("types[5]", f'"text/*/x" {not_a_type}'),
            ],
        )

    def test_types_any(self) -> None:
        self.assertGatewayProblems(
            'compression: {types: ["*/*", "*/json"]}\n',
            [
                ("types[0]", '"*/*" would compress images and archives too: name the types'),
                ("types[1]", '"*/json" would compress images and archives too: name the types'),
            ],
        )

    def test_types_event_stream(self) -> None:
        never = (
            '"text/event-stream" is never compressed (each event must reach the client as it '
            "is sent)"
        )
        self.assertGatewayProblems(
            'compression: {types: [text/event-stream, "Text/Event-Stream"]}\n',
            [("types[0]", never), ("types[1]", never)],
        )

    def test_empty_types(self) -> None:
        self.assertGatewayProblems(
            "compression: {types: []}\n", [("types", "must not be an empty list")]
        )

    def test_unknown_field_with_did_you_mean(self) -> None:
        self.assertGatewayProblems(
            "compression: {enable: false, minsize: 10, encoding: [br], level: 9}\n",
            [
                ("enable", 'unknown field; did you mean "enabled"?'),
                ("minsize", 'unknown field; did you mean "minSize"?'),
                ("encoding", 'unknown field; did you mean "encodings"?'),
                ("level", "unknown field"),
            ],
        )

    def test_enabled_not_a_boolean(self) -> None:
        self.assertGatewayProblems(
            'compression: {enabled: "off"}\n',
            [("enabled", "expected a boolean (true or false), got a string")],
        )

    def test_not_a_mapping(self) -> None:
        self.assertProblems(
            gateway("compression: true\n"),
            [(GATEWAY_RESOURCE, "spec.compression", "expected a mapping, got a boolean")],
        )

    def test_every_problem_at_once(self) -> None:
        problems = self.problems(
            gateway("compression: {encodings: [gzip, gzip], minSize: -5, types: ['*/*']}\n")
        )
        self.assertEqual(len(problems), 3, problems)
        for field in ("encodings[1]", "minSize", "types[0]"):
            self.assertTrue(
                any(f"{GATEWAY_RESOURCE}: spec.compression.{field}: " in p for p in problems),
                (field, problems),
            )


class HandlerErrorTests(CompressionConfigTestCase):
    """
    C{compress} must be a boolean on every handler type; C{precompressed} lists each
    known coding at most once, and only on C{static}.
    """

    def assertHandlerProblems(self, handler: str, expected: list[tuple[str, str]]) -> None:
        self.assertProblems(
            GATEWAY + "---\n" + route(handler),
            [(ROUTE_RESOURCE, f"spec.handler.{field}", message) for field, message in expected],
        )

    def test_compress_must_be_a_boolean(self) -> None:
        for template in HANDLERS.values():
            for value, kind in (('"no"', "a string"), ("1", "an integer"), ("[false]", "a list")):
                self.assertHandlerProblems(
                    template.format(extra=f"compress: {value}"),
                    [("compress", f"expected a boolean (true or false), got {kind}")],
                )

    def test_precompressed_unknown_and_duplicate(self) -> None:
        self.assertHandlerProblems(
            '{type: static, dir: ".", precompressed: [br, brr, gzip, br, deflate, gzip]}',
            [
                (
                    "precompressed[1]",
                    f'unknown encoding "brr"; did you mean "br"? {EXPECTED_CODINGS}',
                ),
                ("precompressed[3]", '"br" is listed twice'),
                ("precompressed[4]", f'unknown encoding "deflate" {EXPECTED_CODINGS}'),
                ("precompressed[5]", '"gzip" is listed twice'),
            ],
        )

    def test_precompressed_not_a_list(self) -> None:
        self.assertHandlerProblems(
            '{type: static, dir: ".", precompressed: br}',
            [("precompressed", "expected a list of strings, got a string")],
        )

    def test_precompressed_misspelt(self) -> None:
        self.assertHandlerProblems(
            '{type: static, dir: ".", precompresed: [br]}',
            [("precompresed", 'unknown field; did you mean "precompressed"?')],
        )

    def test_precompressed_only_on_static(self) -> None:
        for type_ in ("reverse-proxy", "api", "health"):
            path = self.write(
                GATEWAY + "---\n" + route(HANDLERS[type_].format(extra="precompressed: [br]"))
            )
            [problem] = self.problems_at(path)
            self.assertTrue(
                problem.startswith(
                    f"{path}, {ROUTE_RESOURCE}: spec.handler.precompressed: unknown field"
                ),
                problem,
            )


class CheckTests(CompressionConfigTestCase):
    """
    C{edgegw check} (in this process) refuses a configuration with such mistakes, located,
    and shows the static handlers' sidecar codings in its route table.
    """

    def run_check(self, text: str) -> tuple[str, int, str, str]:
        """
        C{edgegw check} on C{text}: the file's path, the exit status, stdout, stderr.
        """
        path = self.write(text)
        out, err = io.StringIO(), io.StringIO()
        code = check(os.path.dirname(path), out, err)
        return path, code, out.getvalue(), err.getvalue()

    def test_refuses_compression_mistakes(self) -> None:
        path, code, out, err = self.run_check(
            gateway("compression: {encodings: [brotli], types: [text/event-stream]}\n")
            + "---\n"
            + route('{type: static, dir: ".", compress: "no", precompressed: [gzip, gzip]}')
        )
        self.assertEqual((code, out), (1, ""))
        self.assertIn("configuration has 4 errors", err)
        for resource, field in (
            (GATEWAY_RESOURCE, "spec.compression.encodings[0]"),
            (GATEWAY_RESOURCE, "spec.compression.types[0]"),
            (ROUTE_RESOURCE, "spec.handler.compress"),
            (ROUTE_RESOURCE, "spec.handler.precompressed[1]"),
        ):
            self.assertIn(f"{path}, {resource}: {field}: ", err)
        self.assertIn(
            f'{path}, {GATEWAY_RESOURCE}: spec.compression.encodings[0]: unknown encoding "brotli"',
            err,
        )

    def test_accepts_and_describes(self) -> None:
        _, code, out, err = self.run_check(
            gateway("compression: {enabled: false, encodings: [gzip], minSize: 0}\n")
            + "---\n"
            + route('{type: static, dir: ".", compress: false, precompressed: [gzip, br]}')
            + "---\nkind: Route\nmetadata: {name: s}\n"
            + 'spec: {match: /s/, handler: {type: static, dir: ".", precompressed: []}}\n'
            + "---\nkind: Route\nmetadata: {name: t}\n"
            + 'spec: {match: /t/, handler: {type: static, dir: "."}}\n'
        )
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        [r_line] = [line for line in lines if line.startswith("/r/ ")]
        [s_line] = [line for line in lines if line.startswith("/s/ ")]
        [t_line] = [line for line in lines if line.startswith("/t/ ")]
        self.assertIn("precompressed gzip/br", r_line)
        self.assertIn("no precompressed", s_line)
        self.assertNotIn("precompressed", t_line)
