"""Knowledge packs: code patterns with knobs, as data, and the renderer that turns a path of choices into
kernel sources.

A pack lives in ``packs/<task-family>/<target>/``: ``pack.yaml`` (records in schema.py, format in README.md) and
``templates/*.j2`` (Jinja2). It declares *families* (competing kernel designs, the first-level branches of
the search tree) and ordered *decisions*, each with *choices*; a choice carries the planner's priors
(difficulty 1-5, rating 0-10, confidence 0-1, impacts 0-10), hardware requirements, knobs (allowed
values and a default), template variables and extra compile flags. A *path* is a family plus the choices
taken so far; every decision not taken falls back to its naive default, so any partial path renders.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from ksearch import yamlio
from ksearch.errors import KnowledgeError
from ksearch.targets.abi_types import C_TYPES
from ksearch.knowledge.schema import (  # noqa: F401 - re-exported
    Choice,
    Decision,
    Family,
    Knob,
    KnobValue,
    Requirements,
    Signature,
    StrictRecord,
    simd_bits_of,
)

PACKS_DIR = Path(__file__).parent / "packs"

#: Definition dtype -> C type used by the templates: the C dialect of the cpu target's ABI (float16 as GCC's
#: _Float16, bfloat16 as its uint16_t bits, C having no portable bfloat16 type); a pack's ``ctypes`` goes over it
CTYPES: dict[str, str] = C_TYPES

#: The name under which the family is given in a path's ``choices``.
FAMILY_KEY = "family"


class RenderedKernel(BaseModel):
    """Sources of one kernel rendered from a pack, with the fully resolved path that produced it."""

    model_config = ConfigDict(frozen=True)

    pack: str
    target: str
    task: str
    family: str
    choices: dict[str, str] = Field(description="every decision of the family -> choice id, in pack order")
    knobs: dict[str, KnobValue] = Field(description="every knob of the chosen choices -> value")
    sources: dict[str, str] = Field(description="file name -> text, e.g. {'kernel.c': ...}")
    entry_point: str
    compile_flags: list[str] = Field(description="flags added to the target's compile command")
    launch: dict[str, Any] = Field(default_factory=dict, description="the target's launch plan (GPU targets; "
                                   "empty for the CPU), rendered from the family's launch template")

    @property
    def content_hash(self) -> str:
        """sha256 of sources + entry point + flags + target: identical kernels from different paths collide."""
        h = hashlib.sha256()
        for part in (self.target, self.entry_point, *self.compile_flags):
            h.update(part.encode() + b"\0")
        for name in sorted(self.sources):
            h.update(name.encode() + b"\0" + self.sources[name].encode() + b"\0")
        if self.launch:  # absent for the CPU: its hashes stay what they were
            h.update(b"launch\0" + json.dumps(self.launch, sort_keys=True).encode())
        return h.hexdigest()

    def candidate(self, proposer: str | None = None, **extra: Any):
        """This kernel as the judge's Candidate (sources, entry point, flags, launch plan). With ``proposer``, its
        meta records the provenance: the proposer, pack, family, choices and knobs, then ``extra``; else it is empty."""
        from ksearch.records import Candidate

        meta = {} if proposer is None else {"proposer": proposer, "pack": self.pack, "family": self.family,
                                            "choices": self.choices, "knobs": self.knobs, **extra}
        return Candidate(target=self.target, sources=dict(self.sources), entry_point=self.entry_point,
                         compile_flags=list(self.compile_flags), launch=dict(self.launch), meta=meta)


class ResolvedPath(BaseModel):
    """A family and a choice for each of its decisions (given or default), with the knobs' values."""

    model_config = ConfigDict(frozen=True)

    family: str
    choices: dict[str, str]
    knobs: dict[str, KnobValue]


class Pack(StrictRecord):
    """A knowledge pack (pack.yaml). Build with :func:`load_pack` or :func:`load_pack_file`."""

    name: str
    version: int = 1
    target: str
    description: str = ""
    tasks: list[str] = Field(min_length=1)
    signature: Signature
    entry_point: str = "run"
    source_file: str = Field(default="kernel.c", description="name of the rendered source in RenderedKernel.sources")
    ctypes: dict[str, str] = Field(default_factory=dict, description="dtype -> C type, over CTYPES (e.g. "
                                   "float16: __half for CUDA)")
    restrict: str = Field(default="restrict", description="the pointer qualifier in task.params (__restrict__ in CUDA)")
    axis_ctype: str = Field(default="int64_t", description="C type of the axes in task.params")
    default_family: str
    vars: dict[str, Any] = Field(default_factory=dict, description="template variables before any choice")
    families: list[Family] = Field(min_length=1)
    decisions: list[Decision] = Field(default_factory=list)

    _dir: Path | None = PrivateAttr(default=None)
    _env: jinja2.Environment | None = PrivateAttr(default=None)
    _removed: dict[tuple[str, str], list[str]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> "Pack":
        fam_ids = [f.id for f in self.families]
        _unique(fam_ids, "family")
        _unique([d.id for d in self.decisions], "decision")
        if FAMILY_KEY in {d.id for d in self.decisions}:
            raise ValueError(f"decision id {FAMILY_KEY!r} is reserved for the family")
        if self.default_family not in fam_ids:
            raise ValueError(f"default_family {self.default_family!r} is not a family ({fam_ids})")
        knob_owner: dict[str, str] = {}
        for d in self.decisions:
            _unique([c.id for c in d.choices], f"choice of decision {d.id!r}")
            for c in d.choices:
                for f in c.families or []:
                    if f not in fam_ids:
                        raise ValueError(f"choice {d.id}.{c.id} names unknown family {f!r} ({fam_ids})")
                for k in c.knobs:
                    if knob_owner.setdefault(k, d.id) != d.id:
                        raise ValueError(f"knob {k!r} of {d.id}.{c.id} is also a knob of decision {knob_owner[k]!r}")
            for fam in fam_ids:
                if not d.applies_to(fam):
                    continue
                if isinstance(d.default, dict) and fam not in d.default:
                    raise ValueError(f"decision {d.id!r} has no default for family {fam!r}")
                dflt = d.choice(d.default_for(fam))
                if dflt is None or not dflt.applies_to(fam):
                    raise ValueError(f"default {d.default_for(fam)!r} of decision {d.id!r} is not one of its "
                                     f"choices for family {fam!r}")
                if dflt.requires.isa or dflt.requires.simd_bits:
                    raise ValueError(f"default {d.id}.{dflt.id} must not require hardware ({dflt.requires})")
        for name in (*self.signature.inputs, *self.signature.outputs):
            if name not in self.signature.dtypes:
                raise ValueError(f"signature.dtypes gives no dtypes for {name!r}")
        return self

    # -- queries -----------------------------------------------------------------------------------

    def family(self, family_id: str) -> Family:
        """Raises KnowledgeError for an unknown family."""
        for f in self.families:
            if f.id == family_id:
                return f
        raise KnowledgeError(f"pack {self.name!r}: unknown family {family_id!r} (known: {[f.id for f in self.families]})")

    def decision(self, decision_id: str) -> Decision:
        """Raises KnowledgeError for an unknown decision."""
        for d in self.decisions:
            if d.id == decision_id:
                return d
        raise KnowledgeError(f"pack {self.name!r}: unknown decision {decision_id!r} "
                             f"(known: {[d.id for d in self.decisions]})")

    def decisions_for(self, family_id: str) -> list[Decision]:
        """The decisions of a family in plan order, each reduced to the choices that apply to it."""
        self.family(family_id)
        return [d.model_copy(update={"choices": d.choices_for(family_id)})
                for d in self.decisions if d.applies_to(family_id)]

    def applicable(self, hardware_flags: list[str]) -> "Pack":
        """This pack without the choices whose hardware requirements ``hardware_flags`` do not meet.

        ``hardware_flags``: ISA strings such as ``["avx2", "fma", "avx512f", "f16c"]``. Rendering a removed
        choice from the returned pack raises KnowledgeError naming what the hardware lacks.
        """
        data = self.model_dump()
        removed: dict[tuple[str, str], list[str]] = dict(self._removed)
        for d_data, d in zip(data["decisions"], self.decisions):
            keep = []
            for c_data, c in zip(d_data["choices"], d.choices):
                miss = c.requires.missing(hardware_flags)
                if miss:
                    removed[(d.id, c.id)] = miss
                else:
                    keep.append(c_data)
            d_data["choices"] = keep
        pack = Pack.model_validate(data)
        pack._dir, pack._env, pack._removed = self._dir, self._env, removed
        return pack

    # -- paths and rendering -----------------------------------------------------------------------

    def resolve(self, choices: dict[str, str] | None = None, knobs: dict[str, Any] | None = None) -> ResolvedPath:
        """Complete a partial path: the family (``choices["family"]``, else the pack's default family), the
        given choices, defaults for every other decision of the family, and every knob of the chosen
        choices (given value, else its default).

        Raises:
            KnowledgeError: an unknown family, decision, choice or knob, a choice or decision that does not
                apply to the family, a choice removed for the hardware, or a knob value not allowed.
        """
        choices = dict(choices or {})
        knobs = dict(knobs or {})
        family = str(choices.pop(FAMILY_KEY, self.default_family))
        self.family(family)
        for dec_id, ch_id in choices.items():
            dec = self.decision(dec_id)
            if not dec.applies_to(family):
                raise KnowledgeError(f"pack {self.name!r}: decision {dec_id!r} does not apply to family {family!r}")
            ch = dec.choice(ch_id)
            if ch is None:
                if (dec_id, ch_id) in self._removed:
                    raise KnowledgeError(f"pack {self.name!r}: choice {dec_id}.{ch_id} is not applicable on this "
                                         f"hardware (missing {', '.join(self._removed[(dec_id, ch_id)])})")
                raise KnowledgeError(f"pack {self.name!r}: unknown choice {ch_id!r} for decision {dec_id!r} "
                                     f"(known: {[c.id for c in dec.choices]})")
            if not ch.applies_to(family):
                raise KnowledgeError(f"pack {self.name!r}: choice {dec_id}.{ch_id} does not apply to family "
                                     f"{family!r} (only {ch.families})")
        full: dict[str, str] = {}
        values: dict[str, KnobValue] = {}
        for dec in self.decisions:
            if not dec.applies_to(family):
                continue
            ch = dec.choice(choices.get(dec.id, dec.default_for(family)))
            full[dec.id] = ch.id
            for kname, knob in ch.knobs.items():
                if kname in knobs:
                    given = knobs.pop(kname)
                    v = knob.coerce(given)
                    if v is None:
                        raise KnowledgeError(f"pack {self.name!r}: knob {kname!r} of {dec.id}.{ch.id} must be one of "
                                             f"{knob.values}, not {given!r}")
                    values[kname] = v
                else:
                    values[kname] = knob.default
        for kname, v in knobs.items():
            owners = [f"{d.id}.{c.id}" for d in self.decisions for c in d.choices if kname in c.knobs]
            if owners:
                raise KnowledgeError(f"pack {self.name!r}: knob {kname!r}={v!r} belongs to {', '.join(owners)}, "
                                     f"not on this path ({family}: {full})")
            raise KnowledgeError(f"pack {self.name!r}: unknown knob {kname!r}={v!r}")
        return ResolvedPath(family=family, choices=full, knobs=values)

    def render(self, definition: Any, choices: dict[str, str] | None = None,
               knobs: dict[str, Any] | None = None) -> RenderedKernel:
        """Render the kernel of a (partial) path for a task definition. Deterministic: the same inputs give
        the same text.

        Args:
            definition: a ``ksearch.tasks.definition.Definition`` (or an object with ``.definition``).
            choices: decision id -> choice id, plus optionally ``"family"`` -> family id.
            knobs: knob name -> value (must be one of the knob's values).

        Raises:
            KnowledgeError: see :meth:`resolve`; the definition is not one of the pack's tasks or does not
                match its signature (names, order, dtypes); a template fails to render.
        """
        definition = getattr(definition, "definition", definition)
        path = self.resolve(choices, knobs)
        task = self._task_context(definition)
        vars_ = dict(self.vars)
        flags: list[str] = []
        for dec_id, ch_id in path.choices.items():
            ch = self.decision(dec_id).choice(ch_id)
            vars_.update(ch.vars)
            flags.extend(f for f in ch.compile_flags if f not in flags)
        fam = self.family(path.family)
        ctx = {"pack": {"name": self.name, "version": self.version}, "family": path.family,
               "choice": path.choices, "knob": path.knobs, "var": vars_, "task": task}
        try:
            source = self._environment().get_template(fam.template).render(ctx)
        except jinja2.TemplateError as e:
            where = f"{getattr(e, 'name', None) or fam.template}" + (f":{e.lineno}" if getattr(e, "lineno", None) else "")
            raise KnowledgeError(f"pack {self.name!r}: template {where} failed for {path.family} {path.choices} "
                                 f"{path.knobs}: {e}") from None
        launch = self._render_launch(fam, ctx, path) if fam.launch else {}
        return RenderedKernel(pack=self.name, target=self.target, task=definition.name, family=path.family,
                              choices=path.choices, knobs=path.knobs, sources={self.source_file: source},
                              entry_point=self.entry_point, compile_flags=flags, launch=launch)

    def _render_launch(self, fam: Family, ctx: dict[str, Any], path: ResolvedPath) -> dict[str, Any]:
        """The family's launch template rendered with the kernel's context and parsed as YAML (a mapping)."""
        try:
            text = self._environment().get_template(fam.launch).render(ctx)
            plan = yamlio.safe_load(text)
        except (jinja2.TemplateError, yaml.YAMLError) as e:
            raise KnowledgeError(f"pack {self.name!r}: launch template {fam.launch} failed for {path.family} "
                                 f"{path.choices} {path.knobs}: {e}") from None
        if not isinstance(plan, dict):
            raise KnowledgeError(f"pack {self.name!r}: launch template {fam.launch} gave {type(plan).__name__}, "
                                 f"not a mapping, for {path.family} {path.choices} {path.knobs}")
        return plan

    def _task_context(self, definition: Any) -> dict[str, Any]:
        """Template variables derived from the definition (C types, the entry point's parameter list)."""
        if definition.name not in self.tasks:
            raise KnowledgeError(f"pack {self.name!r} does not apply to task {definition.name!r} (tasks: {self.tasks})")
        sig = self.signature
        for what, want, got in (("inputs", sig.inputs, list(definition.inputs)),
                                ("outputs", sig.outputs, list(definition.outputs)),
                                ("axes", sig.axes, list(definition.axes))):
            if want != got:
                raise KnowledgeError(f"pack {self.name!r}: task {definition.name!r} has {what} {got}, the pack's "
                                     f"signature expects {want}")
        specs = {**definition.inputs, **definition.outputs}
        ctype: dict[str, str] = {}
        ctypes = {**CTYPES, **self.ctypes}
        for name, spec in specs.items():
            if spec.dtype not in sig.dtypes[name] or spec.dtype not in ctypes:
                raise KnowledgeError(f"pack {self.name!r}: {name} of task {definition.name!r} is {spec.dtype}; the "
                                     f"templates handle {sig.dtypes[name]}")
            ctype[name] = ctypes[spec.dtype]
        r = self.restrict
        params = [f"const {ctype[n]} *{r} {n}" for n in definition.inputs]
        input_params = ", ".join(params)
        params += [f"{ctype[n]} *{r} {n}" for n in definition.outputs]
        params += [f"{self.axis_ctype} {a}" for a in definition.axes]
        axis_max = {a: getattr(ax, "max", None) or getattr(ax, "value", None) for a, ax in definition.axes.items()}
        return {"name": definition.name, "entry_point": self.entry_point, "ctype": ctype,
                "dtype": {n: s.dtype for n, s in specs.items()}, "params": ", ".join(params),
                "input_params": input_params, "axis_max": axis_max}

    def _environment(self) -> jinja2.Environment:
        if self._env is None:
            raise KnowledgeError(f"pack {self.name!r} has no template directory (build it with load_pack)")
        return self._env


def load_pack_file(path: str | Path) -> Pack:
    """Load and validate one pack.yaml (its templates in ``templates/`` next to it).

    Raises:
        KnowledgeError: the file is missing or not YAML, a field is invalid (the message names the file and
            the field, e.g. ``decisions[3](exp).choices[2](exp2-poly).rating``), a template is missing or
            does not parse.
    """
    path = Path(path)
    try:
        data = yamlio.safe_load(path.read_text())
    except OSError as e:
        raise KnowledgeError(f"cannot read knowledge pack {path}: {e}") from None
    except yaml.YAMLError as e:
        raise KnowledgeError(f"{path}: not valid YAML: {e}") from None
    return _pack_from(path, data)


def _pack_from(path: Path, data: Any) -> Pack:
    """The pack parsed from ``path`` (``data``: its YAML), validated, with its templates loaded; raises
    KnowledgeError as `load_pack_file` says."""
    if not isinstance(data, dict):
        raise KnowledgeError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    try:
        pack = Pack.model_validate(data)
    except ValidationError as e:
        lines = [f"{_loc(data, err['loc'])}: {err['msg']}" for err in e.errors()]
        raise KnowledgeError(f"{path}: invalid knowledge pack:\n  " + "\n  ".join(lines)) from None
    pack._dir = path.parent
    pack._env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(path.parent / "templates")), undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    for fam in pack.families:
        for field, name in (("template", fam.template), ("launch", fam.launch)):
            if name is None:
                continue
            try:
                pack._env.get_template(name)
            except jinja2.TemplateNotFound:
                raise KnowledgeError(f"{path}: families.{fam.id}.{field}: {name!r} not found in "
                                     f"{path.parent / 'templates'}") from None
            except jinja2.TemplateSyntaxError as e:
                raise KnowledgeError(f"{path}: template {e.name or name}:{e.lineno}: {e.message}") from None
    return pack


def load_pack(task_name: str, target: str, packs_dir: str | Path | None = None) -> Pack:
    """The pack under ``packs_dir`` (default: the built-in packs) that lists ``task_name`` for ``target``.

    Raises:
        KnowledgeError: no pack (or more than one) applies, or the pack is malformed.
    """
    root = Path(packs_dir) if packs_dir is not None else PACKS_DIR
    found = []  # (file, its YAML): each pack file is parsed once
    for f in sorted(root.glob(f"*/{target}/pack.yaml")):
        try:
            data = yamlio.safe_load(f.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise KnowledgeError(f"{f}: cannot read: {e}") from None
        if isinstance(data, dict) and task_name in (data.get("tasks") or []):
            found.append((f, data))
    if not found:
        raise KnowledgeError(f"no knowledge pack for task {task_name!r} on target {target!r} under {root}")
    if len(found) > 1:
        raise KnowledgeError(f"several knowledge packs claim task {task_name!r} on {target!r}: "
                             f"{[str(f) for f, _ in found]}")
    return _pack_from(*found[0])


def _unique(ids: list[str], what: str) -> None:
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"duplicate {what} ids: {dup}")


def _loc(data: Any, loc: tuple) -> str:
    """A pydantic error location as a readable field path, list items labelled by their id where they have one."""
    out, node = "", data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and "id" in node:
                out += f"({node['id']})"
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "(top)"
