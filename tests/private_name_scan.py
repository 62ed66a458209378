"""
Find the places in a source tree that use another project's private names.

A private name is a leading-underscore (not dunder) attribute or module name of Twisted,
treq or txredisapi: an attribute their classes define or set on C{self}, or a module whose
path has a private part (C{twisted.internet._sslverify}). edgegw keeps every use of one
in L{edgegw.seam} (and the reactor subclass in L{edgegw.reactor}); this scan is what
tests that it does.

It reads the code as written, so it sees C{x._name}, C{getattr(x, "_name")} (and
C{hasattr}, C{setattr}, C{delattr}) and imports. An attribute the scanned code sets and
reads itself is its own, unless the class it sets it on inherits the name from a foreign
class (then it overrides or reads theirs) or another project's classes define a name
that C{x._name} on some other object could mean, and the module reading it defines no
such attribute itself.
"""

from __future__ import annotations

import ast
import importlib
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
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _foreign(module_name: object) -> bool:
    return isinstance(module_name, str) and module_name.split(".")[0] in FOREIGN


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


@cache
def class_privates(cls: type) -> frozenset[str]:
    """
    The private names C{cls} itself defines: in its namespace, its slots, or as
    C{self.<name>} in its methods.
    """
    names = {name for name in vars(cls) if _private(name)}
    slots = vars(cls).get("__slots__", ())
    names.update(slot for slot in ([slots] if isinstance(slots, str) else slots))
    node = _class_node(cls)
    if node is not None:
        for child in ast.walk(node):
            if (
                isinstance(child, ast.Attribute)
                and isinstance(child.value, ast.Name)
                and child.value.id == "self"
            ):
                names.add(child.attr)
    return frozenset(name for name in names if _private(name))


def _foreign_bases(cls: type) -> list[type]:
    return [base for base in cls.__mro__ if _foreign(base.__module__)]


def inherited_privates(cls: type) -> frozenset[str]:
    """
    The private names C{cls} inherits from foreign classes.
    """
    names: set[str] = set()
    for base in _foreign_bases(cls):
        names |= class_privates(base)
    return frozenset(names)


def _walk_package(package: str) -> Iterator[ModuleType]:
    root = importlib.import_module(package)
    yield root
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        yield importlib.import_module(info.name)


def _foreign_classes(modules: list[ModuleType]) -> set[type]:
    """
    Every foreign class the modules can reach: those they import or inherit from, and
    the other classes of the modules those come from.
    """
    classes: set[type] = set()
    foreign_modules: set[str] = set()
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, ModuleType) and _foreign(value.__name__):
                foreign_modules.add(value.__name__)
            elif isinstance(value, type):
                for base in value.__mro__:
                    if _foreign(base.__module__):
                        classes.add(base)
                        foreign_modules.add(base.__module__)
    for name in foreign_modules:
        found = sys.modules.get(name)
        if found is None:
            continue
        for value in vars(found).values():
            if isinstance(value, type) and _foreign(value.__module__):
                classes.add(value)
    return classes


class _Scanner(ast.NodeVisitor):
    def __init__(
        self, module: ModuleType, path: str, foreign: frozenset[str], own: frozenset[str]
    ) -> None:
        self.module = module
        self.path = path
        self.foreign = foreign
        self.own = own
        self.classes: list[type | None] = []
        self.uses: list[Use] = []

    def _use(self, node: ast.AST, name: str) -> None:
        self.uses.append(Use(self.path, getattr(node, "lineno", 0), name))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer = self.classes[-1] if self.classes else self.module
        cls = getattr(outer, node.name, None) if outer is not None else None
        self.classes.append(cls if isinstance(cls, type) else None)
        inherited = inherited_privates(cls) if isinstance(cls, type) else frozenset()
        for statement in node.body:
            for target in _assigned_names(statement):
                if target in inherited:
                    self._use(statement, target)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if self.classes:
            cls = self.classes[-1]
            inherited = inherited_privates(cls) if cls is not None else frozenset()
            if node.name in inherited:
                self._use(node, node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _attribute(self, node: ast.AST, target: ast.expr, name: str) -> None:
        if not _private(name):
            return
        if isinstance(target, ast.Name) and target.id in ("self", "cls") and self.classes:
            cls = self.classes[-1]
            if cls is not None:
                if name in inherited_privates(cls):
                    self._use(node, name)
                return
        if name in self.foreign and name not in self.own:
            self._use(node, name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._attribute(node, node.value, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in _ATTRIBUTE_CALLS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            self._attribute(node, node.args[0], node.args[1].value)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _foreign(alias.name) and any(_private(part) for part in alias.name.split(".")):
                self._use(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not _foreign(module):
            return
        if any(_private(part) for part in module.split(".")):
            self._use(node, module)
        for alias in node.names:
            if _private(alias.name):
                self._use(node, f"{module}.{alias.name}")


def _assigned_names(statement: ast.stmt) -> Iterator[str]:
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            if isinstance(target, ast.Name):
                yield target.id
    elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        yield statement.target.id


def _own_privates(module: ModuleType, foreign_inherited: dict[type, frozenset[str]]) -> set[str]:
    """
    The private names a module's own classes define for themselves.
    """
    own: set[str] = set()
    for value in vars(module).values():
        if isinstance(value, type) and value.__module__ == module.__name__:
            own |= class_privates(value) - foreign_inherited.get(value, frozenset())
    return own


def scan(package: str, exempt: frozenset[str] = frozenset()) -> list[Use]:
    """
    Every use of a foreign private name in C{package}'s modules, except in the modules
    named in C{exempt}.
    """
    modules = list(_walk_package(package))
    foreign: set[str] = set()
    for cls in _foreign_classes(modules):
        foreign |= class_privates(cls)
    frozen_foreign = frozenset(foreign)
    uses: list[Use] = []
    for module in modules:
        if module.__name__ in exempt or module.__file__ is None:
            continue
        inherited = {
            value: inherited_privates(value)
            for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == module.__name__
        }
        scanner = _Scanner(
            module,
            str(Path(module.__file__).relative_to(Path.cwd()))
            if Path(module.__file__).is_relative_to(Path.cwd())
            else module.__file__,
            frozen_foreign,
            frozenset(_own_privates(module, inherited)),
        )
        scanner.visit(_module_tree(module.__file__))
        uses.extend(scanner.uses)
    return sorted(set(uses))


if __name__ == "__main__":
    for use in scan("edgegw", frozenset(sys.argv[1:])):
        print(use)
