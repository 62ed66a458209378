"""
Group rendering: RFC 4514 distinguished names, match, render, strip and bounds.
"""

from __future__ import annotations

import time

from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.model import GroupsSpec
from edgegw.identity.groups import MAX_ITEM_LENGTH, MAX_ITEMS, GroupRenderer, parse_dn


class ParseDNTests(SynchronousTestCase):
    def test_simple(self) -> None:
        self.assertEqual(
            parse_dn("cn=admins,ou=groups,dc=example,dc=com"),
            [[("cn", "admins")], [("ou", "groups")], [("dc", "example")], [("dc", "com")]],
        )

    def test_upper_case_types(self) -> None:
        self.assertEqual(
            parse_dn("CN=Admins,OU=Groups,DC=Example,DC=Com"),
            [[("cn", "Admins")], [("ou", "Groups")], [("dc", "Example")], [("dc", "Com")]],
        )
        self.assertEqual(parse_dn("Cn=x"), [[("cn", "x")]])

    def test_oid_type(self) -> None:
        self.assertEqual(
            parse_dn("2.5.4.3=Admins,0.9.2342=x"),
            [
                [("2.5.4.3", "Admins")],
                [("0.9.2342", "x")],
            ],
        )

    def test_hyphenated_type(self) -> None:
        self.assertEqual(parse_dn("x-Custom1=v"), [[("x-custom1", "v")]])

    def test_escaped_comma(self) -> None:
        self.assertEqual(
            parse_dn("cn=Smith\\, John,ou=People"),
            [[("cn", "Smith, John")], [("ou", "People")]],
        )

    def test_hex_escaped_comma(self) -> None:
        self.assertEqual(
            parse_dn("cn=Smith\\2C John,ou=People"),
            [[("cn", "Smith, John")], [("ou", "People")]],
        )
        self.assertEqual(parse_dn("cn=a\\2cb"), [[("cn", "a,b")]])

    def test_escaped_specials(self) -> None:
        self.assertEqual(
            parse_dn('cn=\\"\\+\\,\\;\\<\\>\\=\\#\\\\x'),
            [[("cn", '"+,;<>=#\\x')]],
        )

    def test_escaped_hash_at_start(self) -> None:
        self.assertEqual(parse_dn("cn=\\#1"), [[("cn", "#1")]])

    def test_hex_utf8(self) -> None:
        self.assertEqual(parse_dn("cn=Caf\\C3\\A9"), [[("cn", "Caf\u00e9")]])
        self.assertEqual(parse_dn("cn=\\c3\\a9t\\c3\\a9"), [[("cn", "\u00e9t\u00e9")]])
        self.assertEqual(parse_dn("cn=\\E2\\82\\AC5"), [[("cn", "\u20ac5")]])

    def test_literal_utf8(self) -> None:
        self.assertEqual(
            parse_dn("cn=Caf\u00e9,o=\u00c4"),
            [
                [("cn", "Caf\u00e9")],
                [("o", "\u00c4")],
            ],
        )

    def test_multi_valued(self) -> None:
        self.assertEqual(
            parse_dn("cn=Admins+uid=42,ou=Groups"),
            [[("cn", "Admins"), ("uid", "42")], [("ou", "Groups")]],
        )

    def test_escaped_plus(self) -> None:
        self.assertEqual(parse_dn("cn=a\\+b"), [[("cn", "a+b")]])
        self.assertEqual(parse_dn("cn=a\\2Bb"), [[("cn", "a+b")]])

    def test_spaces_around_separators(self) -> None:
        self.assertEqual(
            parse_dn(" cn = Admins , ou = Groups + o = x "),
            [[("cn", "Admins")], [("ou", "Groups"), ("o", "x")]],
        )
        self.assertEqual(parse_dn("cn=a, ou=b"), [[("cn", "a")], [("ou", "b")]])

    def test_inner_spaces_kept(self) -> None:
        self.assertEqual(parse_dn("cn=Domain  Admins"), [[("cn", "Domain  Admins")]])

    def test_escaped_spaces_kept(self) -> None:
        self.assertEqual(parse_dn("cn=\\ a\\ ,ou=b"), [[("cn", " a ")], [("ou", "b")]])
        self.assertEqual(parse_dn("cn=  \\ a\\   "), [[("cn", " a ")]])
        self.assertEqual(parse_dn("cn=a\\20 "), [[("cn", "a ")]])
        self.assertEqual(parse_dn("cn=\\20a"), [[("cn", " a")]])

    def test_equals_and_hash_inside_value(self) -> None:
        self.assertEqual(parse_dn("cn=a=b#c"), [[("cn", "a=b#c")]])

    def test_empty_value(self) -> None:
        self.assertEqual(parse_dn("cn=,ou=x"), [[("cn", "")], [("ou", "x")]])

    def test_hexstring_kept_raw(self) -> None:
        self.assertEqual(
            parse_dn("cn=#04024869 ,ou=x"),
            [[("cn", "#04024869")], [("ou", "x")]],
        )

    def test_escaped_backslash_before_hex_digits(self) -> None:
        self.assertEqual(parse_dn("cn=\\\\41"), [[("cn", "\\41")]])
        self.assertEqual(parse_dn("cn=a\\\\  ,o=b"), [[("cn", "a\\")], [("o", "b")]])

    def test_hex_runs_split(self) -> None:
        self.assertEqual(parse_dn("cn=\\41b\\43\\2c"), [[("cn", "AbC,")]])

    def test_failing_match_is_linear(self) -> None:
        started = time.monotonic()
        self.assertIsNone(parse_dn(("ou=a   +" * 500) + "cn=x;"))
        self.assertIsNone(parse_dn("cn=" + " \\ " * 1300 + "<"))
        self.assertLess(time.monotonic() - started, 1.0)

    def test_malformed(self) -> None:
        for dn in [
            "",
            " ",
            "admins",
            "=admins",
            " =admins",
            "cn=a,ou",
            "cn=a,",
            ",cn=a",
            "cn=a,,ou=b",
            "cn=a+",
            "c n=a",
            "1cn=a",
            "2.5.04.3=a",
            "2.5.=a",
            "cn_x=a",
            "cn=a\\",
            "cn=a\\2",
            "cn=a\\2G",
            "cn=a\\zz",
            "cn=\\C3",
            "cn=\\C3x",
            "cn=\\FF",
            'cn="a"',
            'cn=a"b',
            "cn=<a>",
            "cn=a>",
            "cn=a;ou=b",
            "cn=a\x00",
            "cn=#",
            "cn=#0",
            "cn=#0G",
            "cn=#00 x",
        ]:
            self.assertIsNone(parse_dn(dn), dn)


def renderer(**kwargs: object) -> GroupRenderer:
    return GroupRenderer(GroupsSpec(**kwargs))  # type: ignore[arg-type]


class RenderTests(SynchronousTestCase):
    def test_no_source(self) -> None:
        self.assertEqual(renderer(match=("cn=",)).render({"groups": ["cn=a"]}), ())

    def test_missing_claim(self) -> None:
        self.assertEqual(renderer(source="groups", match=("cn=",)).render({}), ())

    def test_non_list_source(self) -> None:
        groups = renderer(source="groups", match=("cn=",))
        for value in [None, 1, 1.5, True, {"cn": "a"}, b"cn=a"]:
            self.assertEqual(groups.render({"groups": value}), (), value)

    def test_single_string(self) -> None:
        groups = renderer(source="groups", match=("ou=groups",))
        self.assertEqual(groups.render({"groups": "cn=Admins,ou=Groups"}), ("Admins",))

    def test_non_string_items_ignored(self) -> None:
        groups = renderer(source="groups", match=("cn=",))
        claims = {"groups": [1, None, "cn=a", ["cn=b"], {"cn": "c"}, "cn=d", True]}
        self.assertEqual(groups.render(claims), ("a", "d"))

    def test_empty_match_matches_nothing(self) -> None:
        groups = renderer(source="groups")
        self.assertEqual(groups.render({"groups": ["cn=a", "cn=b"]}), ())
        groups = renderer(source="groups", render="dn")
        self.assertEqual(groups.render({"groups": ["cn=a"]}), ())

    def test_match_case_insensitive_substring(self) -> None:
        groups = renderer(source="memberOf", match=("OU=App", "ou=other"))
        claims = {
            "memberOf": [
                "cn=Readers,ou=app,dc=example",
                "CN=Writers,OU=APPS,DC=EXAMPLE",
                "cn=Staff,ou=People,dc=example",
                "cn=Misc,OU=Other,dc=example",
            ]
        }
        self.assertEqual(groups.render(claims), ("Readers", "Writers", "Misc"))

    def test_match_on_raw_dn(self) -> None:
        # The pattern is looked for in the DN as written, not in its decoded values.
        groups = renderer(source="groups", match=("a,b",))
        self.assertEqual(groups.render({"groups": ["cn=a\\,b", "cn=a\\2Cb"]}), ())
        groups = renderer(source="groups", match=("a\\,b",))
        self.assertEqual(groups.render({"groups": ["cn=a\\,b", "cn=a\\2Cb"]}), ("a,b",))

    def test_render_cn(self) -> None:
        groups = renderer(source="groups", match=("dc=example",))
        claims = {
            "groups": [
                "CN=Admins,OU=Groups,DC=Example,DC=Com",
                "cn=Smith\\, John,ou=People,dc=example",
                "uid=x+cN=Multi,dc=example",
                "ou=NoCn,dc=example",
                "ou=Top,cn=Inner,cn=Outer,dc=example",
                "cn=Caf\\C3\\A9,dc=example",
                "cn=bad\\,,dc=example,\\",
                "not a dn dc=example",
            ]
        }
        self.assertEqual(
            groups.render(claims),
            ("Admins", "Smith, John", "Multi", "Inner", "Caf\u00e9"),
        )

    def test_render_dn(self) -> None:
        groups = renderer(source="groups", match=("ou=groups",), render="dn")
        claims = {
            "groups": [
                "cn=Admins,ou=Groups,dc=example",
                "  cn=Spaced,ou=groups  ",
                "not a dn ou=groups",
                "cn=Other,ou=People",
            ]
        }
        self.assertEqual(
            groups.render(claims),
            ("cn=Admins,ou=Groups,dc=example", "cn=Spaced,ou=groups", "not a dn ou=groups"),
        )

    def test_strip_first_prefix_wins(self) -> None:
        groups = renderer(source="groups", match=("cn=",), strip=("app-", "APP-ADMIN-"))
        claims = {"groups": ["cn=App-Admin-Users", "cn=app-readers", "cn=other"]}
        self.assertEqual(groups.render(claims), ("Admin-Users", "readers", "other"))

    def test_strip_case_insensitive(self) -> None:
        groups = renderer(source="groups", match=("cn=",), strip=("GRP_",))
        claims = {"groups": ["cn=grp_Admins", "cn=Grp_Readers", "cn=xgrp_no"]}
        self.assertEqual(groups.render(claims), ("Admins", "Readers", "xgrp_no"))

    def test_strip_dn(self) -> None:
        groups = renderer(source="groups", match=("ou=",), render="dn", strip=("CN=",))
        self.assertEqual(groups.render({"groups": ["cn=a,ou=b"]}), ("a,ou=b",))

    def test_strip_to_empty_dropped(self) -> None:
        groups = renderer(source="groups", match=("cn=",), strip=("app-",))
        claims = {"groups": ["cn=APP-", "cn=app-x", "cn=", "cn=\\ "]}
        self.assertEqual(groups.render(claims), ("x", " "))

    def test_empty_strip_prefix_ignored(self) -> None:
        groups = renderer(source="groups", match=("cn=",), strip=("", "app-"))
        self.assertEqual(groups.render({"groups": ["cn=app-x"]}), ("x",))

    def test_no_strip(self) -> None:
        groups = renderer(source="groups", match=("cn=",))
        self.assertEqual(groups.render({"groups": ["cn=app-x"]}), ("app-x",))

    def test_dedupe_keeps_first(self) -> None:
        groups = renderer(source="groups", match=("cn=",), strip=("app-",))
        claims = {
            "groups": [
                "cn=b,ou=one",
                "cn=a,ou=one",
                "cn=b,ou=two",
                "cn=app-a",
                "cn=B",
            ]
        }
        self.assertEqual(groups.render(claims), ("b", "a", "B"))

    def test_tuple_source(self) -> None:
        groups = renderer(source="groups", match=("cn=",))
        self.assertEqual(groups.render({"groups": ("cn=a", "cn=b")}), ("a", "b"))

    def test_item_bound(self) -> None:
        groups = renderer(source="groups", match=("cn=",))
        items = [f"cn=g{index}" for index in range(MAX_ITEMS + 5)]
        rendered = groups.render({"groups": items})
        self.assertEqual(len(rendered), MAX_ITEMS)
        self.assertEqual(rendered[0], "g0")
        self.assertEqual(rendered[-1], f"g{MAX_ITEMS - 1}")

    def test_non_strings_count_toward_item_bound(self) -> None:
        groups = renderer(source="groups", match=("cn=",))
        items: list[object] = [0] * MAX_ITEMS
        items.append("cn=late")
        self.assertEqual(groups.render({"groups": items}), ())

    def test_length_bound(self) -> None:
        groups = renderer(source="groups", match=("cn=",), render="dn")
        longest = "cn=" + "a" * (MAX_ITEM_LENGTH - 3)
        too_long = "cn=" + "b" * (MAX_ITEM_LENGTH - 2)
        self.assertEqual(groups.render({"groups": [too_long, longest]}), (longest,))
        self.assertEqual(groups.render({"groups": too_long}), ())

    def test_hostile_token_is_cheap(self) -> None:
        # The costliest shape: as many RDNs as fit, in every item the bound lets through.
        groups = renderer(source="groups", match=("cn=",))
        claims = {"groups": [("ou=a," * 816) + f"cn={index}" for index in range(10 * MAX_ITEMS)]}
        self.assertTrue(all(len(dn) <= MAX_ITEM_LENGTH for dn in claims["groups"]))
        started = time.monotonic()
        rendered = groups.render(claims)
        self.assertEqual(rendered, tuple(str(index) for index in range(MAX_ITEMS)))
        # Generous: well under a second on a laptop.
        self.assertLess(time.monotonic() - started, 5.0)
