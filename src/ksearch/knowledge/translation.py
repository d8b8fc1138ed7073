"""The translation layer as data: how CUDA expertise carries to another target.

One YAML file per (source, target) pair in ``translation/<from>-<to>.yaml`` (cuda-metal, cuda-cpu,
cuda-triton), with three parts:

- ``concepts``: a CUDA concept (warp, __shfl_xor_sync, __shared__, HBM bandwidth, ...), the target's
  equivalent, its hard limits on both sides (each with the source of the number), what breaks when it is
  ported naively, and the static rule that catches the naive port where there is one;
- ``patterns``: how an optimization looks on both sides (row reductions with shuffles, the exp2 trick, online
  softmax, K transposed, chunked scans with carries, vectorized loads), with short code sketches;
- ``assertions``: properties an expert kernel keeps (fp32 running state, every output written once, no
  out-of-bounds reads, ...), each with the checks that enforce it: a static rule of a target
  (``eval/static_rules/<target>.yaml``) or a workload of a built-in task (``tasks/builtin/<task>``).

``sources`` maps short keys to references (the shared reference pages, vendor documents); every concept and
limit names one. `load_translation` validates all of it; `unresolved_checks` lists checks that name no
existing rule or workload. ``ksearch knowledge show --from cuda --to metal`` prints a map.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ksearch import yamlio
from ksearch.errors import KnowledgeError, TargetError
from ksearch.targets import get_target

TRANSLATION_DIR = Path(__file__).parent / "translation"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ConceptLimit(_Strict):
    """A hard limit on both sides: what it is (``name``), CUDA's value, the target's value, and the source key."""

    name: str = Field(min_length=1)
    cuda: str = Field(min_length=1)
    target: str = Field(min_length=1)
    source: str = Field(min_length=1)


class Concept(_Strict):
    """One row of a concept map."""

    concept: str = Field(min_length=1, description="the CUDA concept")
    equivalent: str = Field(min_length=1, description="the target's equivalent ('none ...' when there is none)")
    limits: list[ConceptLimit] = Field(default_factory=list)
    note: str = Field(min_length=1, description="what breaks when it is ported naively")
    source: str = Field(min_length=1, description="a key of the map's sources")
    check: str | None = Field(default=None, description="the target's static rule that catches a naive port")


class Pattern(_Strict):
    """A code pattern: what it does and a short sketch per side (keys: ``cuda`` and the target)."""

    id: str = Field(min_length=1)
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)
    sketches: dict[str, str]


class Check(_Strict):
    """What enforces an assertion: a static ``rule`` of ``target``, or a ``workload`` of built-in ``task``."""

    rule: str | None = None
    target: str | None = None
    workload: str | None = None
    task: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "Check":
        if bool(self.rule) == bool(self.workload):
            raise ValueError("a check names either a rule (with its target) or a workload (with its task)")
        if self.rule and not self.target:
            raise ValueError(f"rule check {self.rule!r} needs the target whose rule file holds it")
        if self.workload and not self.task:
            raise ValueError(f"workload check {self.workload!r} needs the task that has it")
        return self

    def __str__(self) -> str:
        return f"rule {self.target}/{self.rule}" if self.rule else f"workload {self.task}/{self.workload}"


class Assertion(_Strict):
    """A property an expert kernel keeps, and the checks that enforce it; an assertion without checks must say
    in ``note`` why none exists yet (e.g. no built-in task exercises it)."""

    id: str = Field(min_length=1)
    property: str = Field(min_length=1)
    why: str = Field(min_length=1)
    checks: list[Check] = Field(default_factory=list)
    note: str | None = None

    @model_validator(mode="after")
    def _checked_or_explained(self) -> "Assertion":
        if not self.checks and not (self.note and self.note.strip()):
            raise ValueError(f"assertion {self.id!r} has no check: name one (a static rule with its target, or a "
                             "workload with its task), or say in `note` why none exists yet")
        return self


class TranslationMap(_Strict):
    """Concept map, code patterns and assertions for porting ``source`` kernels to ``target``."""

    source: str = Field(alias="from")
    target: str = Field(alias="to")
    title: str
    sources: dict[str, str] = Field(min_length=1)
    concepts: list[Concept] = Field(min_length=1)
    patterns: list[Pattern] = Field(default_factory=list)
    assertions: list[Assertion] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "TranslationMap":
        keys = set(self.sources)
        for i, c in enumerate(self.concepts):
            for s in [c.source] + [lim.source for lim in c.limits]:
                if s not in keys:
                    raise ValueError(f"concepts[{i}]({c.concept}): source {s!r} is not a key of sources "
                                     f"({', '.join(sorted(keys))})")
        for kind, items in (("patterns", self.patterns), ("assertions", self.assertions)):
            ids = [x.id for x in items]
            dup = {x for x in ids if ids.count(x) > 1}
            if dup:
                raise ValueError(f"{kind}: duplicate ids {sorted(dup)}")
        for p in self.patterns:
            missing = {self.source, self.target} - set(p.sketches)
            if missing:
                raise ValueError(f"patterns({p.id}): no sketch for {sorted(missing)}")
        return self

    def all_checks(self) -> list[tuple[str, Check]]:
        """(where, check) for every check the map names: concepts' rules (on the target) and assertions'."""
        out = [(f"concepts({c.concept})", Check(rule=c.check, target=self.target)) for c in self.concepts if c.check]
        out += [(f"assertions({a.id})", ch) for a in self.assertions for ch in a.checks]
        return out


def available() -> list[tuple[str, str]]:
    """(from, to) of every translation map shipped."""
    out = []
    for p in sorted(TRANSLATION_DIR.glob("*.yaml")):
        src, _, dst = p.stem.partition("-")
        if dst:
            out.append((src, dst))
    return out


@lru_cache(maxsize=16)
def load_translation(source: str, target: str) -> TranslationMap:
    """The translation map from ``source`` to ``target`` (e.g. cuda -> metal).

    Raises:
        KnowledgeError: no such map (the message lists those that exist), or a malformed file (the field).
    """
    path = TRANSLATION_DIR / f"{source}-{target}.yaml"
    if not path.is_file():
        have = ", ".join(f"{a} -> {b}" for a, b in available()) or "none"
        raise KnowledgeError(f"no translation map from {source!r} to {target!r} (available: {have})")
    return load_translation_file(path)


def load_translation_file(path: Path) -> TranslationMap:
    try:
        data = yamlio.safe_load(Path(path).read_text())
        return TranslationMap.model_validate(data or {})
    except yaml.YAMLError as e:
        raise KnowledgeError(f"translation map {path}: not valid YAML: {e}") from None
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise KnowledgeError(f"translation map {path}: " + "; ".join(lines)) from None


def unresolved_checks(tmap: TranslationMap) -> list[str]:
    """Checks that name a rule or workload that does not exist (empty when every check resolves)."""
    from ksearch.eval.static_checks import rules_for
    from ksearch.tasks import load_task

    problems = []
    workloads: dict[str, set[str]] = {}
    for where, ch in tmap.all_checks():
        if ch.rule:
            if ch.rule not in {r.id for r in rules_for(ch.target or "")}:
                problems.append(f"{where}: {ch}: no such rule")
            continue
        if ch.task not in workloads:
            try:
                workloads[ch.task or ""] = {w.name or w.label for w in load_task(ch.task or "").workloads}
            except Exception as e:  # noqa: BLE001 - any failure to load is a problem to report
                problems.append(f"{where}: {ch}: task does not load ({e})")
                workloads[ch.task or ""] = set()
                continue
        if ch.workload not in workloads[ch.task or ""]:
            problems.append(f"{where}: {ch}: no such workload")
    return problems


#: the platform every shipped map starts from (``translation/<source>-<to>.yaml``)
SOURCE = "cuda"


def map_for_target(target: str, source: str = SOURCE) -> TranslationMap | None:
    """The map from ``source`` to the kernels target ``target`` writes (the target's `translation_map`: cpu,
    triton, mlx-metal -> metal; a name no target has is taken as a map's own ``to``, e.g. ``metal``), or None for
    a target no map leads to (cuda). Raises KnowledgeError on a malformed map file."""
    try:
        to = get_target(target).translation_map
    except TargetError:
        to = target
    if to is None or (source, to) not in available():
        return None
    return load_translation(source, to)


def own_knowledge(target: str = SOURCE) -> tuple[list[Pattern], list[Assertion]]:
    """The source side's own patterns and assertions, for a target that is the source of the maps (cuda).

    Patterns: every map's patterns that have a ``target`` sketch, once per id (first map in `available` order).
    Assertions: every map's assertions once per id, keeping the checks that apply to ``target`` (workloads of
    built-in tasks, rules of ``target``); an assertion whose checks are all rules of other targets (Metal's
    threadgroup limit, Triton's no-torch rule) is about the port and is left out.
    """
    patterns: dict[str, Pattern] = {}
    assertions: dict[str, Assertion] = {}
    for src, dst in available():
        tmap = load_translation(src, dst)
        for p in tmap.patterns:
            if target in p.sketches:
                patterns.setdefault(p.id, p)
        for a in tmap.assertions:
            if a.id in assertions:
                continue
            kept = [c for c in a.checks if c.workload or c.target == target]
            if a.checks and not kept:
                continue
            assertions[a.id] = a.model_copy(update={"checks": kept})
    return list(patterns.values()), list(assertions.values())


def as_dict(tmap: TranslationMap) -> dict:
    """The map as plain data (``from``/``to`` keys as in the file)."""
    return tmap.model_dump(by_alias=True, exclude_none=True)
