"""Records of a knowledge pack's pack.yaml below the top level: families, decisions, choices, knobs, hardware
requirements and the planner's priors (schema in README.md). Strict: an unknown key is an error."""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

KnobValue = Union[bool, int, float, str]


class StrictRecord(BaseModel):
    """Pack records: unknown keys are errors (a typo in a pack must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Impacts(StrictRecord):
    """Predicted effect of an action, each 0-10 (10: best for that aspect)."""

    memory_bandwidth: float = Field(ge=0, le=10)
    register_pressure: float = Field(ge=0, le=10)
    hw_fit: float = Field(ge=0, le=10)


class Requirements(StrictRecord):
    """Hardware a choice needs: every ISA flag in ``isa`` (lower case, as /proc/cpuinfo spells them) and
    vectors of at least ``simd_bits`` bits."""

    isa: list[str] = Field(default_factory=list)
    simd_bits: int = Field(default=0, ge=0)

    def missing(self, hardware_flags: list[str]) -> list[str]:
        """What ``hardware_flags`` lack, e.g. ``["avx512f", "simd_bits>=512"]``; empty when satisfied."""
        flags = {f.lower() for f in hardware_flags}
        out = [f for f in self.isa if f.lower() not in flags]
        if simd_bits_of(hardware_flags) < self.simd_bits:
            out.append(f"simd_bits>={self.simd_bits}")
        return out


class Knob(StrictRecord):
    """A tunable parameter of a choice: its allowed values and the value used when none is given."""

    values: list[KnobValue] = Field(min_length=1)
    default: KnobValue
    description: str = ""

    @model_validator(mode="after")
    def _default_allowed(self) -> "Knob":
        if self.default not in self.values:
            raise ValueError(f"default {self.default!r} is not among values {self.values}")
        return self

    def coerce(self, value: Any) -> KnobValue | None:
        """The allowed value equal to ``value`` (also when given as its string, e.g. "64" for 64), else None."""
        for v in self.values:
            if type(value) is type(v) and value == v:
                return v
        for v in self.values:
            if str(value) == str(v):
                return v
        return None


class _Action(StrictRecord):
    """What the planner sees of a family or a choice (the world model's action and its priors)."""

    id: str = Field(min_length=1)
    title: str
    description: str = ""
    difficulty: int = Field(ge=1, le=5)
    rating: float = Field(ge=0, le=10, description="prior overall rating, 0-10")
    confidence: float = Field(ge=0, le=1, description="prior confidence in the rating, 0-1")
    impacts: Impacts


class Family(_Action):
    """A competing kernel design, rendered by one template. ``launch`` (GPU targets): a template that renders
    the kernel's launch plan as YAML (e.g. docs/cuda-target.md), with the same context as the kernel's."""

    template: str
    launch: str | None = None


class Choice(_Action):
    """One alternative of a decision."""

    families: list[str] | None = Field(default=None, description="families it applies to; None: all")
    requires: Requirements = Field(default_factory=Requirements)
    knobs: dict[str, Knob] = Field(default_factory=dict)
    vars: dict[str, Any] = Field(default_factory=dict, description="template variables it sets")
    compile_flags: list[str] = Field(default_factory=list, description="extra compiler flags it adds")

    def applies_to(self, family: str) -> bool:
        return self.families is None or family in self.families


class Decision(StrictRecord):
    """An ordered step of a plan: pick one of ``choices``. ``default`` is the naive choice, one id for every
    family, or a map family -> id."""

    id: str = Field(min_length=1)
    title: str
    description: str = ""
    default: str | dict[str, str]
    choices: list[Choice] = Field(min_length=1)

    def choices_for(self, family: str) -> list[Choice]:
        return [c for c in self.choices if c.applies_to(family)]

    def applies_to(self, family: str) -> bool:
        return bool(self.choices_for(family))

    def default_for(self, family: str) -> str:
        return self.default if isinstance(self.default, str) else self.default[family]

    def choice(self, choice_id: str) -> Choice | None:
        return next((c for c in self.choices if c.id == choice_id), None)


class Signature(StrictRecord):
    """What the templates assume of a task definition: names in order, and the dtypes handled per tensor."""

    inputs: list[str]
    outputs: list[str]
    axes: list[str]
    dtypes: dict[str, list[str]]



def simd_bits_of(hardware_flags: list[str]) -> int:
    """Widest vector register implied by ISA flags: 512 (avx512f), 256 (avx/avx2), 128 (sse*/neon), else 0."""
    flags = {f.lower() for f in hardware_flags}
    if "avx512f" in flags:
        return 512
    if flags & {"avx", "avx2"}:
        return 256
    if any(f.startswith("sse") for f in flags) or flags & {"neon", "asimd"}:
        return 128
    return 0
