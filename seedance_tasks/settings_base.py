"""The base of every settings model. Its own module so `*/settings.py` never import `config`
(which assembles them): no import circle, and each section's model imports on its own."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base of every settings model: unknown keys are refused, values validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
