"""What every recipe model shares: strict pydantic settings and the user-facing error type."""
from __future__ import annotations

import types
import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the field, the value and the fix."""


def _numeric(annotation) -> bool:
    """int or float, alone or in an Optional / union (bool is an int to Python, but never a number here)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_numeric(a) for a in typing.get_args(annotation))
    return annotation in (int, float)


class NoBoolNumbers(BaseModel):
    """A number field refuses a boolean: pydantic takes `true` as 1, and YAML reads yes / no / on / off as
    booleans, so `concurrency: yes` would run at concurrency 1. It refuses YAML's .nan and .inf too, which would
    otherwise pass an unbounded field (a timeout) or be named by whichever bound they fail."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value, info: ValidationInfo):
        if isinstance(value, bool) and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError("a boolean where a number is allowed (YAML reads true, false, yes, no, on and off as "
                             "booleans)")
        return value


class Strict(NoBoolNumbers):
    """Unknown fields are errors (a typo must not silently fall back to a default); specs are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
