"""
Find the places in a source tree that use another project's private names.

A private name is a leading-underscore (not dunder) name of Twisted, treq or txredisapi:
an attribute their classes define or use on C{self}, a module-level name of theirs, or a
module whose path has a private part (C{twisted.internet._sslverify}). edgegw keeps every
use of one in L{edgegw.seam} (and the reactor subclass in L{edgegw.reactor}); this scan
is what tests that it does.

It reads the code as written, and reports:
  - C{x._name} on any object but C{self}/C{cls}, when some class or module of those
    projects (any of their modules loaded once the package is imported) has C{_name};
  - C{self._name} in a class when a foreign base defines it, or when no class of the
    scanned package in the class's bases ever sets or defines it (a mixin reading a
    foreign class's state);
  - a definition in a class body that overrides a foreign base's private name;
  - C{module._name} where C{module} is one of those projects' modules;
  - such a name given as a string (a constant, or a module-level name bound to one):
    to C{getattr}, C{hasattr}, C{setattr} or C{delattr}, C{operator.attrgetter} or
    C{methodcaller}, as a key of C{vars(x)} or C{x.__dict__}, or a private module to
    C{importlib.import_module} or C{__import__};
  - an import of a private module or name.
So a scanned package must not give its own attributes names that those projects use
(the gateway's own non-C{self} private reads are of names no foreign class has).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

FOREIGN: tuple[str, ...] = ("twisted", "treq", "txredisapi")
_ATTRIBUTE_CALLS = frozenset({"getattr", "hasattr", "setattr", "delattr"})
_NAME_CALLS = frozenset({"attrgetter", "methodcaller"})
_IMPORT_CALLS = frozenset({"import_module", "__import__"})
# Python's own public API with a leading underscore (namedtuples'), not a private name.
_PYTHON_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


@dataclass(frozen=True, order=True)
class Use:
    """
    One use of a foreign private name.
    """

    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}"


def _private(name: str) -> bool:
    return (
        name.startswith("_")
        and not (name.startswith("__") and name.endswith("__"))
        and name not in _PYTHON_API
    )


def _foreign(module_name: object) -> bool:
    return isinstance(module_name, str) and module_name.split(".")[0] in FOREIGN


def _private_module_path(text: str) -> bool:
    parts = text.split(".")
    return _foreign(text) and len(parts) > 1 and any(_private(part) for part in parts)


@cache
def _module_tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def _class_node(cls: type) -> ast.ClassDef | None:
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        return None
    if path is None:
        return None
    node: ast.AST = _module_tree(path)
    for part in cls.__qualname__.split("."):
        if part == "<locals>":
            return None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and child.name == part:
                node = child
                break
        else:
            return None
    return node if isinstance(node, ast.ClassDef) else None


def _class_body_names(node: ast.ClassDef) -> Iterator[str]:
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield statement.name
        yield from _assigned_names(statement)


def _self_attributes(node: ast.ClassDef, stored_only: bool) -> Iterator[str]:
    for child in ast.walk(node):
        if (
            isinstance(child, ast.Attribute)
            and isinstance(child.value, ast.Name)
            and child.value.id == "self"
            and (not stored_only or isinstance(child.ctx, (ast.Store, ast.Del)))
        ):
            yield child.attr


@cache
def class_privates(cls: type, stored_only: bool = False) -> frozenset[str]:
    """
    The private names C{cls} itself defines: in its namespace, its slots, and as
    C{self.<name>} in its methods (only those it sets, with C{stored_only}).
    """
    names = {name for name in vars(cls) if _private(name)}
    slots = vars(cls).get("__slots__", ())
    names.update(slot for slot in ([slots] if isinstance(slots, str) else slots))
    node = _class_node(cls)
    if node is not None:
        names.update(_self_attributes(node, stored_only))
    return frozenset(name for name in names if _private(name))


def _walk_package(package: str) -> Iterator[ModuleType]:
    root = importlib.import_module(package)
    yield root
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        yield importlib.import_module(info.name)


@cache
def foreign_names() -> frozenset[str]:
    """
    Every private name in the sources of those projects (their tests left out): each
    module's own, and each class's (defined in its body, or set or used on C{self}).
    Read from the files, so that the set does not depend on what happens to be imported.
    """
    names: set[str] = set()
    for project in FOREIGN:
        spec = importlib.util.find_spec(project)
        if spec is None or spec.submodule_search_locations is None:
            continue
        for root in spec.submodule_search_locations:
            for path in Path(root).rglob("*.py"):
                if "test" in path.relative_to(root).parts[:-1]:
                    continue
                try:
                    tree = ast.parse(path.read_bytes())
                except (SyntaxError, UnicodeDecodeError):
                    continue
                for statement in tree.body:
                    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(statement.name)
                    else:
                        names.update(_assigned_names(statement))
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        names.update(_class_body_names(node))
                        names.update(_self_attributes(node, stored_only=False))
    return frozenset(name for name in names if _private(name))


def _assigned_names(statement: ast.stmt) -> Iterator[str]:
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            if isinstance(target, ast.Name):
                yield target.id
    elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        yield statement.target.id


def _resolve(expression: ast.expr, namespace: dict[str, object]) -> object:
    if isinstance(expression, ast.Name):
        if expression.id in namespace:
            return namespace[expression.id]
        return getattr(builtins, expression.id, None)
    if isinstance(expression, ast.Attribute):
        owner = _resolve(expression.value, namespace)
        return getattr(owner, expression.attr, None) if owner is not None else None
    return None


@dataclass
class _ClassScope:
    """
    What the scan knows of the class it is in: the classes of its bases' MROs.
    """

    mro: tuple[type, ...]

    def inherited(self) -> frozenset[str]:
        names: set[str] = set()
        for cls in self.mro:
            if _foreign(cls.__module__):
                names |= class_privates(cls)
        return frozenset(names)

    def own(self, body: frozenset[str]) -> frozenset[str]:
        names = set(body)
        for cls in self.mro:
            if not _foreign(cls.__module__) and cls is not object:
                names |= class_privates(cls, stored_only=True)
        return frozenset(names)


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: ModuleType, path: str, foreign: frozenset[str]) -> None:
        self.module = module
        self.namespace = vars(module)
        self.path = path
        self.foreign = foreign
        self.classes: list[tuple[_ClassScope, frozenset[str], frozenset[str]]] = []
        self.exempt: set[str] = set()
        self.uses: list[Use] = []

    def _use(self, node: ast.AST, name: str) -> None:
        self.uses.append(Use(self.path, getattr(node, "lineno", 0), name))

    def _scope(self, node: ast.ClassDef) -> _ClassScope:
        mro: list[type] = []
        for base in node.bases:
            resolved = _resolve(base, self.namespace)
            if isinstance(resolved, type):
                mro.extend(cls for cls in resolved.__mro__ if cls not in mro)
        return _ClassScope(tuple(mro))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name in self.exempt:
            return
        scope = self._scope(node)
        inherited = scope.inherited()
        body = frozenset(name for name in _class_body_names(node) if _private(name))
        own = scope.own(body) | frozenset(_self_attributes(node, stored_only=True))
        for statement in node.body:
            names = list(_assigned_names(statement))
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.append(statement.name)
            for name in names:
                if name in inherited:
                    self._use(statement, name)
        self.classes.append((scope, inherited, own))
        self.generic_visit(node)
        self.classes.pop()

    def _attribute(self, node: ast.AST, target: ast.expr, name: str) -> None:
        if not _private(name):
            return
        if isinstance(target, ast.Name) and target.id in ("self", "cls") and self.classes:
            _, inherited, own = self.classes[-1]
            if name in inherited or (name in self.foreign and name not in own):
                self._use(node, name)
            return
        resolved = _resolve(target, self.namespace)
        if isinstance(resolved, ModuleType):
            if _foreign(resolved.__name__):
                self._use(node, name)
            return
        if name in self.foreign:
            self._use(node, name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._attribute(node, node.value, node.attr)
        self.generic_visit(node)

    def _string(self, expression: ast.expr) -> str | None:
        if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
            return expression.value
        if isinstance(expression, ast.Name):
            value = self.namespace.get(expression.id)
            return value if isinstance(value, str) else None
        return None

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = (
            func.id
            if isinstance(func, ast.Name)
            else func.attr
            if isinstance(func, ast.Attribute)
            else ""
        )
        if called in _ATTRIBUTE_CALLS and len(node.args) >= 2:
            name = self._string(node.args[1])
            if name is not None:
                self._attribute(node, node.args[0], name)
        elif called in _NAME_CALLS:
            for argument in node.args:
                name = self._string(argument)
                if name is not None:
                    for part in name.split("."):
                        if _private(part) and part in self.foreign:
                            self._use(node, part)
        elif called in _IMPORT_CALLS and node.args:
            name = self._string(node.args[0])
            if name is not None and _private_module_path(name):
                self._use(node, name)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        value = node.value
        namespace_of = (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "vars"
        ) or (isinstance(value, ast.Attribute) and value.attr == "__dict__")
        if namespace_of and isinstance(node.slice, ast.expr):
            name = self._string(node.slice)
            if name is not None and _private(name) and name in self.foreign:
                self._use(node, name)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _private_module_path(alias.name):
                self._use(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not _foreign(module):
            return
        if _private_module_path(module):
            self._use(node, module)
        for alias in node.names:
            if _private(alias.name):
                self._use(node, f"{module}.{alias.name}")


def scan(
    package: str,
    exempt: frozenset[str] = frozenset(),
    exempt_classes: frozenset[tuple[str, str]] = frozenset(),
) -> list[Use]:
    """
    Every use of a foreign private name in C{package}'s modules, except in the modules
    named in C{exempt} and in the classes named in C{exempt_classes} (module name, class
    name: the class body, wherever it is defined in the module).
    """
    modules = list(_walk_package(package))
    foreign = foreign_names()
    uses: list[Use] = []
    cwd = Path.cwd()
    for module in modules:
        if module.__name__ in exempt or module.__file__ is None:
            continue
        source = Path(module.__file__)
        scanner = _Scanner(
            module,
            str(source.relative_to(cwd)) if source.is_relative_to(cwd) else str(source),
            foreign,
        )
        scanner.exempt = {name for owner, name in exempt_classes if owner == module.__name__}
        scanner.visit(_module_tree(module.__file__))
        uses.extend(scanner.uses)
    return sorted(set(uses))


if __name__ == "__main__":
    for use in scan(
        "edgegw",
        frozenset(sys.argv[1:]),
        frozenset({("edgegw.reactor", "EdgeReactor")}),
    ):
        print(use)
