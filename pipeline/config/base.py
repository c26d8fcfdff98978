"""What every recipe model shares: strict pydantic settings and the user-facing error type."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the field, the value and the fix."""


class Strict(BaseModel):
    """Unknown fields are errors (a typo must not silently fall back to a default); specs are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
