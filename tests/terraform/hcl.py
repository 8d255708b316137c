"""Static reading of the Terraform tree: parsed files, modules, variables, calls.

No Terraform binary or provider is needed: python-hcl2 parses the files, and the
helpers here answer the questions the tests ask (what a module declares, what a call
passes, what a type constraint looks like).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hcl2
from hcl2 import SerializationOptions

REPO_ROOT = Path(__file__).resolve().parents[2]
TERRAFORM_ROOT = REPO_ROOT / "terraform"
MODULES_ROOT = TERRAFORM_ROOT / "modules"
ENVIRONMENTS_ROOT = TERRAFORM_ROOT / "environments"
ENVIRONMENTS = ("aws", "gcp", "multicloud")

# Arguments of a module block that Terraform itself consumes, not the module.
MODULE_META_ARGUMENTS = frozenset({"source", "version", "providers", "count", "for_each", "depends_on"})

_OPTIONS = SerializationOptions(
    strip_string_quotes=True, with_comments=False, explicit_blocks=False, preserve_heredocs=False
)


def parse_text(text: str) -> dict[str, Any]:
    return hcl2.loads(text, serialization_options=_OPTIONS)


@functools.cache
def parse_file(path: Path) -> dict[str, Any]:
    return parse_text(path.read_text())


def tf_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tf"))


def all_tf_files() -> list[Path]:
    return sorted(TERRAFORM_ROOT.rglob("*.tf"))


def module_dirs() -> list[Path]:
    """Every directory under terraform/modules that holds Terraform files."""
    return sorted({p.parent for p in MODULES_ROOT.rglob("*.tf")})


def environment_dirs() -> list[Path]:
    return [ENVIRONMENTS_ROOT / name for name in ENVIRONMENTS]


def blocks(directory: Path, kind: str) -> dict[str, dict[str, Any]]:
    """Labelled blocks of one kind (variable, output, module…) across a directory's files."""
    found: dict[str, dict[str, Any]] = {}
    for path in tf_files(directory):
        for entry in parse_file(path).get(kind, []):
            for label, body in entry.items():
                found[label] = body
    return found


def resources(directory: Path) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path in tf_files(directory):
        for entry in parse_file(path).get("resource", []):
            for rtype, named in entry.items():
                for name, body in named.items():
                    found.append((rtype, name, body))
    return found


def locals_(directory: Path) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in tf_files(directory):
        for entry in parse_file(path).get("locals", []):
            merged.update(entry)
    return merged


@dataclass(frozen=True)
class Variable:
    name: str
    type: str | None
    description: str | None
    has_default: bool

    @property
    def required(self) -> bool:
        return not self.has_default


def variables(directory: Path) -> dict[str, Variable]:
    return {
        name: Variable(
            name=name,
            type=body.get("type"),
            description=body.get("description"),
            has_default="default" in body,
        )
        for name, body in blocks(directory, "variable").items()
    }


@dataclass(frozen=True)
class ModuleCall:
    caller: Path
    name: str
    source: str
    arguments: frozenset[str]

    @property
    def target(self) -> Path:
        return (self.caller / self.source).resolve()


def module_calls(directory: Path) -> list[ModuleCall]:
    return [
        ModuleCall(
            caller=directory,
            name=name,
            source=body["source"],
            arguments=frozenset(k for k in body if k not in MODULE_META_ARGUMENTS),
        )
        for name, body in blocks(directory, "module").items()
    ]


def all_directories() -> list[Path]:
    return module_dirs() + environment_dirs()


# ---------------------------------------------------------------- type constraints
#
# A tiny reader for Terraform type constraints, enough to compare the catalog's
# object types with the JSON schema: primitives, list/set/map/tuple, object({...})
# and optional(T[, default]). Defaults are skipped, not evaluated.

_TOKEN = re.compile(
    r'\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_-]*)|(?P<punct>[(){}\[\],=])|(?P<other>"(?:[^"\\]|\\.)*"|[^\s(){}\[\],=]+))'
)


@dataclass(frozen=True)
class TfType:
    kind: str  # string | number | bool | any | list | set | map | tuple | object
    element: TfType | None = None
    attributes: tuple[tuple[str, TfType, bool], ...] = ()  # (name, type, optional)

    def attribute(self, name: str) -> tuple[TfType, bool]:
        for attr, type_, optional in self.attributes:
            if attr == name:
                return type_, optional
        raise KeyError(name)

    @property
    def attribute_names(self) -> set[str]:
        return {name for name, _, _ in self.attributes}

    @property
    def required_names(self) -> set[str]:
        return {name for name, _, optional in self.attributes if not optional}


def parse_type(text: str) -> TfType:
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1]
    tokens = [m.group(m.lastgroup) for m in _TOKEN.finditer(text) if m.group(0).strip()]
    parser = _TypeParser(tokens)
    result = parser.type_()
    if parser.pos != len(tokens):
        raise ValueError(f"trailing tokens in type {text!r}: {tokens[parser.pos :]}")
    return result


class _TypeParser:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected!r}, got {token!r} at {self.pos}")
        self.pos += 1
        return token

    def type_(self) -> TfType:
        name = self.take()
        if name in {"string", "number", "bool", "any"}:
            return TfType(name)
        if name in {"list", "set", "map"}:
            self.take("(")
            element = self.type_()
            self.take(")")
            return TfType(name, element=element)
        if name == "object":
            self.take("(")
            self.take("{")
            attributes = []
            while self.peek() != "}":
                attr = self.take()
                self.take("=")
                type_, optional = self.attribute_type()
                attributes.append((attr, type_, optional))
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
            self.take(")")
            return TfType("object", attributes=tuple(attributes))
        raise ValueError(f"unsupported type {name!r}")

    def attribute_type(self) -> tuple[TfType, bool]:
        if self.peek() != "optional":
            return self.type_(), False
        self.take("optional")
        self.take("(")
        type_ = self.type_()
        if self.peek() == ",":  # a default: skip it, balanced
            self.take(",")
            depth = 0
            while not (depth == 0 and self.peek() == ")"):
                token = self.take()
                depth += token in "({[" and len(token) == 1
                depth -= token in ")}]" and len(token) == 1
        self.take(")")
        return type_, True
