"""Shared API shapes: problem details, pages, constrained scalars."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Generic, TypeVar

import msgspec

T = TypeVar("T")

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")]
Text200 = Annotated[str, msgspec.Meta(max_length=200)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
PosInt = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
Limit = Annotated[int, msgspec.Meta(ge=1, le=500)]


class FieldProblem(msgspec.Struct):
    field: str
    message: str


class ProblemDetail(msgspec.Struct, omit_defaults=True):
    """RFC 9457 problem details, the one error body of the REST APIs."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldProblem] = []


class Page(msgspec.Struct, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class Timestamped(msgspec.Struct, kw_only=True):
    created_at: dt.datetime
    updated_at: dt.datetime
