"""
From claims to a principal: userinfo need and merge, subject, passport, principal.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.model import GroupsSpec, IdentitySpec
from edgegw.identity.claims import (
    merge_userinfo,
    needs_userinfo,
    passport_of,
    principal_of,
    subject_of,
)
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.principal import Principal

FULL = {
    "sub": "u1",
    "email": "a@example.com",
    "name": "A",
    "given_name": "Ada",
    "family_name": "Lovelace",
}


class NeedsUserinfoTests(SynchronousTestCase):
    def test_always_and_never(self) -> None:
        self.assertTrue(needs_userinfo(IdentitySpec(user_info="always"), FULL))
        self.assertFalse(needs_userinfo(IdentitySpec(user_info="never"), {}))

    def test_auto_complete_token(self) -> None:
        self.assertFalse(needs_userinfo(IdentitySpec(), FULL))

    def test_auto_present_but_null_counts_as_present(self) -> None:
        self.assertFalse(needs_userinfo(IdentitySpec(), {**FULL, "name": None}))

    def test_auto_missing_allowlisted_claim(self) -> None:
        claims = dict(FULL)
        del claims["family_name"]
        self.assertTrue(needs_userinfo(IdentitySpec(), claims))

    def test_auto_empty_allowlist(self) -> None:
        self.assertFalse(needs_userinfo(IdentitySpec(claims=()), {"sub": "u1"}))

    def test_auto_missing_group_source(self) -> None:
        identity = IdentitySpec(claims=(), groups=GroupsSpec(source="memberOf"))
        self.assertTrue(needs_userinfo(identity, {"sub": "u1"}))
        self.assertFalse(needs_userinfo(identity, {"sub": "u1", "memberOf": []}))

    def test_auto_missing_subject_claim(self) -> None:
        identity = IdentitySpec(claims=(), subject_claim="preferred_username")
        self.assertTrue(needs_userinfo(identity, {"sub": "u1"}))
        self.assertFalse(needs_userinfo(identity, {"sub": "u1", "preferred_username": "ada"}))

    def test_auto_missing_sub(self) -> None:
        self.assertTrue(needs_userinfo(IdentitySpec(claims=()), {}))


class MergeUserinfoTests(SynchronousTestCase):
    def test_no_userinfo(self) -> None:
        token = {"sub": "u1", "email": "a@example.com"}
        merged = merge_userinfo(token, None)
        self.assertEqual(merged, token)
        self.assertIsNot(merged, token)

    def test_userinfo_wins(self) -> None:
        token = {"sub": "u1", "email": "old@example.com", "iss": "https://idp"}
        userinfo = {"sub": "u1", "email": "new@example.com", "groups": ["cn=a"]}
        self.assertEqual(
            merge_userinfo(token, userinfo),
            {
                "sub": "u1",
                "email": "new@example.com",
                "iss": "https://idp",
                "groups": ["cn=a"],
            },
        )
        self.assertEqual(token["email"], "old@example.com")

    def test_userinfo_null_wins(self) -> None:
        merged = merge_userinfo({"sub": "u1", "name": "A"}, {"sub": "u1", "name": None})
        self.assertEqual(merged, {"sub": "u1", "name": None})

    def test_sub_mismatch_ignored(self) -> None:
        token = {"sub": "u1", "email": "a@example.com"}
        merged = merge_userinfo(token, {"sub": "u2", "email": "evil@example.com"})
        self.assertEqual(merged, token)

    def test_sub_missing_ignored(self) -> None:
        token = {"sub": "u1", "email": "a@example.com"}
        self.assertEqual(merge_userinfo(token, {"email": "evil@example.com"}), token)

    def test_token_without_sub_ignores_userinfo(self) -> None:
        token = {"email": "a@example.com"}
        self.assertEqual(merge_userinfo(token, {"sub": "u1", "name": "A"}), token)
        self.assertEqual(merge_userinfo(token, {"name": "A"}), token)

    def test_non_string_sub_ignored(self) -> None:
        token = {"sub": 1, "email": "a@example.com"}
        self.assertEqual(merge_userinfo(token, {"sub": 1, "email": "b@example.com"}), token)


class SubjectTests(SynchronousTestCase):
    def test_default_sub(self) -> None:
        self.assertEqual(subject_of(IdentitySpec(), {"sub": "u1"}), "u1")

    def test_configured_claim(self) -> None:
        identity = IdentitySpec(subject_claim="preferred_username")
        claims = {"sub": "u1", "preferred_username": "ada"}
        self.assertEqual(subject_of(identity, claims), "ada")

    def test_fallback_to_sub(self) -> None:
        identity = IdentitySpec(subject_claim="preferred_username")
        for value in [None, "", 42, ["ada"], {"n": "ada"}, True]:
            claims = {"sub": "u1", "preferred_username": value}
            self.assertEqual(subject_of(identity, claims), "u1", value)
        self.assertEqual(subject_of(identity, {"sub": "u1"}), "u1")

    def test_no_subject(self) -> None:
        identity = IdentitySpec(subject_claim="preferred_username")
        cases: list[dict[str, object]] = [
            {},
            {"sub": ""},
            {"sub": 7},
            {"sub": None, "preferred_username": ""},
        ]
        for claims in cases:
            self.assertIsNone(subject_of(identity, claims), claims)
        self.assertIsNone(subject_of(IdentitySpec(), {"sub": ["u1"]}))


class PassportTests(SynchronousTestCase):
    def test_default_allowlist(self) -> None:
        claims = {**FULL, "iss": "https://idp", "aud": "gw"}
        passport = passport_of(IdentitySpec(), claims)
        self.assertEqual(
            passport,
            {
                "email": "a@example.com",
                "name": "A",
                "given_name": "Ada",
                "family_name": "Lovelace",
            },
        )
        self.assertNotIn("sub", passport)

    def test_allowlist_order(self) -> None:
        identity = IdentitySpec(claims=("name", "email", "sub"))
        passport = passport_of(identity, FULL)
        self.assertEqual(
            list(passport.items()),
            [
                ("name", "A"),
                ("email", "a@example.com"),
                ("sub", "u1"),
            ],
        )

    def test_missing_claims_skipped(self) -> None:
        self.assertEqual(passport_of(IdentitySpec(), {"sub": "u1", "name": "A"}), {"name": "A"})

    def test_scalars(self) -> None:
        identity = IdentitySpec(claims=("s", "i", "f", "t", "n"))
        claims = {"s": "x", "i": 3, "f": 1.5, "t": False, "n": None}
        passport = passport_of(identity, claims)
        self.assertEqual(passport, {"s": "x", "i": 3, "f": 1.5, "t": False, "n": None})
        self.assertIs(passport["t"], False)

    def test_lists_become_strings(self) -> None:
        identity = IdentitySpec(claims=("roles", "mixed", "empty"))
        claims = {"roles": ["admin", "dev"], "mixed": ["a", 1, 2.5, True, False], "empty": []}
        self.assertEqual(
            passport_of(identity, claims),
            {
                "roles": ["admin", "dev"],
                "mixed": ["a", "1", "2.5", "true", "false"],
                "empty": [],
            },
        )

    def test_objects_dropped(self) -> None:
        identity = IdentitySpec(claims=("address", "nested", "nulls", "kept", "bytes"))
        claims = {
            "address": {"country": "UK"},
            "nested": ["a", ["b"]],
            "nulls": ["a", None],
            "kept": "yes",
            "bytes": b"raw",
        }
        self.assertEqual(passport_of(identity, claims), {"kept": "yes"})
        self.assertEqual(
            passport_of(IdentitySpec(claims=("x",)), {"x": [{"a": 1}]}),
            {},
        )


class PrincipalTests(SynchronousTestCase):
    def test_principal(self) -> None:
        identity = IdentitySpec(
            claims=("email",),
            groups=GroupsSpec(source="groups", match=("ou=groups",), strip=("app-",)),
        )
        claims = {
            "sub": "u1",
            "email": "a@example.com",
            "groups": ["cn=app-admins,ou=Groups", "cn=staff,ou=People"],
        }
        principal = principal_of(identity, GroupRenderer(identity.groups), claims, "tok")
        self.assertEqual(
            principal,
            Principal(
                subject="u1",
                passport={"email": "a@example.com"},
                groups=("admins",),
                access_token="tok",
            ),
        )
        assert principal is not None
        self.assertEqual(principal.access_token, "tok")

    def test_default_access_token(self) -> None:
        identity = IdentitySpec()
        principal = principal_of(identity, GroupRenderer(identity.groups), {"sub": "u1"})
        self.assertEqual(principal, Principal(subject="u1"))
        assert principal is not None
        self.assertIsNone(principal.access_token)
        self.assertEqual(principal.groups, ())

    def test_subject_claim(self) -> None:
        identity = IdentitySpec(subject_claim="preferred_username")
        claims = {"sub": "u1", "preferred_username": "ada"}
        principal = principal_of(identity, GroupRenderer(identity.groups), claims)
        assert principal is not None
        self.assertEqual(principal.subject, "ada")

    def test_no_subject(self) -> None:
        identity = IdentitySpec()
        renderer = GroupRenderer(identity.groups)
        self.assertIsNone(principal_of(identity, renderer, {"email": "a@example.com"}, "t"))
