"""What a built kernel links and runs at load: its ELF shared object read against the target's allow-list.

The source rules (`static_checks`) read what the candidate wrote; this reads what the compiler and linker made
of it, so no spelling hides a call: a pasted name, a function pointer, a weak reference, a versioned name or a
C++ static initialiser all end up as an undefined dynamic symbol or an entry of ``.init_array``. The policy of a
target is ``static_rules/<target>.symbols.yaml`` (see cpu.symbols.yaml); a target without one is not checked.

Checked, in this order, each failure one `Finding` (rule id in brackets):

- [linked-library] every DT_NEEDED library, and the file of every symbol version requirement, is allowed; no
  DT_RPATH/DT_RUNPATH (another search path), DT_AUDIT/DT_DEPAUDIT (an auditing library runs in the loader),
  DT_FILTER/DT_AUXILIARY (a filter loads another library in its place);
- [linked-symbol] every undefined dynamic symbol (weak or not, whatever its version) is allowed by a family of
  the policy and not refused, and no version it asks for is ``GLIBC_PRIVATE``;
- [interpose-libc] no exported C symbol the library defines has a name of a family of the policy or of a
  source rule (``clock_gettime``, ``memcpy``, ``expf``): a definition that would replace the library's;
- [load-time-code] every entry of .preinit_array/.init_array/.fini_array (as DT_*_ARRAY give them to the
  loader, relocations applied) calls a local function of the compiler's start-up files named in the policy,
  no more often than it allows; DT_INIT/DT_FINI are the policy's ``_init``/``_fini``; no function of the
  candidate lies in .init/.fini; no .ctors/.dtors; no IFUNC symbol or IRELATIVE relocation (a resolver runs
  at load: ``ifunc``, ``target_clones``);
- [binary-layout] no executable stack (PT_GNU_STACK with PF_X: the loader would make every thread's stack
  executable), no segment both writable and executable, no text relocations.

A function counts as the candidate's when its local symbol follows a file symbol named like one of the
candidate's sources (the compiler names each object's file symbol after its source); an entry whose target
has no symbol, or a library without a symbol table, fails closed. Reading uses pyelftools (ELF, System V ABI
and its x86-64/AArch64 supplements for relocation types; glibc's elf/dl-init.c for what the loader calls).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ksearch import yamlio
from ksearch.errors import TargetError

RULES_DIR = Path(__file__).parent / "static_rules"

#: relocation types that store ``base + addend`` (no symbol), by ELF machine
_RELATIVE = {"EM_X86_64": {8}, "EM_AARCH64": {1027}, "EM_386": {8}}
#: relocation types that run an IFUNC resolver at load, by ELF machine
_IRELATIVE = {"EM_X86_64": {37}, "EM_AARCH64": {1032}, "EM_386": {42}}
_DT_TEXTREL_FLAG = 0x4  # DF_TEXTREL in DT_FLAGS
_PF_X, _PF_W = 0x1, 0x2


class SymbolFamily(BaseModel):
    """A family of symbols: ``names`` in each of ``forms`` (``{name}`` stands for any name), or ``patterns``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str
    why: str
    names: tuple[str, ...] = ()
    forms: tuple[str, ...] = ("{name}",)
    patterns: tuple[str, ...] = ()

    @field_validator("forms", "patterns")
    @classmethod
    def _compiles(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            try:
                re.compile(p.replace("{name}", "x"))
            except re.error as e:
                raise ValueError(f"pattern {p!r} is not a valid regular expression: {e}") from None
        return v

    @property
    def regex(self) -> re.Pattern:
        return _family_regex(self.names, self.forms, self.patterns)


@lru_cache(maxsize=64)
def _family_regex(names: tuple[str, ...], forms: tuple[str, ...], patterns: tuple[str, ...]) -> re.Pattern:
    alt = "(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + ")"
    parts = [f.replace("{name}", alt) for f in forms] if names else []
    return re.compile("|".join(f"(?:{p})" for p in parts + list(patterns)) or r"(?!)")


class Explanation(BaseModel):
    """Refused symbols matching ``pattern`` (in full) are explained by source rule ``rule``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str
    rule: str


class LoadTime(BaseModel):
    """What may run at load and unload: per array, function name -> most entries that may call it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    init_array: dict[str, int] = Field(default_factory=dict)
    fini_array: dict[str, int] = Field(default_factory=dict)
    preinit_array: dict[str, int] = Field(default_factory=dict)
    init: str = "_init"
    fini: str = "_fini"


class SymbolPolicy(BaseModel):
    """A target's policy for what its built kernels may link (``static_rules/<target>.symbols.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    libraries: tuple[str, ...]
    symbols: tuple[SymbolFamily, ...]
    refused: tuple[SymbolFamily, ...] = ()
    explain: tuple[Explanation, ...] = ()
    load_time: LoadTime = LoadTime()

    def library_allowed(self, soname: str) -> bool:
        return any(re.fullmatch(p, soname) for p in self.libraries)

    def verdict(self, name: str) -> tuple[bool, SymbolFamily | None]:
        """(allowed, the family that refuses it or None) for an undefined symbol ``name`` (no version)."""
        refused = next((f for f in self.refused if f.regex.fullmatch(name)), None)
        if refused is not None:
            return False, refused
        return any(f.regex.fullmatch(name) for f in self.symbols), None


@lru_cache(maxsize=8)
def policy_for(target: str) -> SymbolPolicy | None:
    """The target's symbol policy, or None when it has none. Raises TargetError on a malformed file."""
    path = RULES_DIR / f"{target}.symbols.yaml"
    if not path.is_file():
        return None
    try:
        return SymbolPolicy.model_validate(yamlio.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, ValidationError) as e:
        raise TargetError(f"symbol policy {path} is malformed: {e}") from None


# -- reading the ELF file ---------------------------------------------------------------------------------


@dataclass
class Symbol:
    """One symbol of .symtab/.dynsym: its name, value, type, binding, section and the file symbol before it
    (locals only: the object it came from)."""

    name: str
    value: int
    type: str
    bind: str
    section: str
    origin: str | None = None


@dataclass
class ElfFacts:
    """What the checks read from one shared object."""

    machine: str
    needed: list[str] = field(default_factory=list)
    #: DT_RPATH, DT_RUNPATH, DT_AUDIT, DT_DEPAUDIT, DT_FILTER, DT_AUXILIARY present: (tag, value)
    search_tags: list[tuple[str, str]] = field(default_factory=list)
    #: (name, version or "", file of the version requirement or "") per undefined dynamic symbol
    undefined: list[tuple[str, str, str]] = field(default_factory=list)
    #: names of the dynamic symbols the library defines and exports (default or protected visibility)
    exported: list[str] = field(default_factory=list)
    version_files: set[str] = field(default_factory=set)
    #: per array (init_array, fini_array, preinit_array): each entry's target, a Symbol or a description
    arrays: dict[str, list[Symbol | str]] = field(default_factory=dict)
    init: Symbol | str | None = None
    fini: Symbol | str | None = None
    symbols: list[Symbol] = field(default_factory=list)
    has_symtab: bool = False
    section_names: set[str] = field(default_factory=set)
    ifuncs: list[str] = field(default_factory=list)
    irelative: int = 0
    exec_stack: bool = False
    wx_segments: int = 0
    textrel: bool = False


def read_elf(path: Path) -> ElfFacts:
    """The facts of ELF shared object ``path`` the checks need. Raises ELFError (pyelftools) or ValueError
    when the file cannot be read as ELF."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        facts = ElfFacts(machine=elf["e_machine"])
        sections = list(elf.iter_sections())
        facts.section_names = {s.name for s in sections}
        names = {i: s.name for i, s in enumerate(sections)}

        def symbols_of(sec) -> list[Symbol]:
            out, origin = [], None
            for sym in sec.iter_symbols():
                kind, bind, ndx = sym["st_info"]["type"], sym["st_info"]["bind"], sym["st_shndx"]
                if kind == "STT_FILE":
                    origin = sym.name
                    continue
                where = names.get(ndx, "") if isinstance(ndx, int) else str(ndx)
                out.append(Symbol(sym.name, sym["st_value"], kind, bind, where,
                                  origin if bind == "STB_LOCAL" else None))
            return out

        symtab = elf.get_section_by_name(".symtab")
        dynsym = elf.get_section_by_name(".dynsym")
        facts.has_symtab = isinstance(symtab, SymbolTableSection)
        facts.symbols = symbols_of(symtab) if facts.has_symtab else []
        dyn = symbols_of(dynsym) if isinstance(dynsym, SymbolTableSection) else []
        facts.ifuncs = sorted({s.name or hex(s.value) for s in facts.symbols + dyn if s.type == "STT_GNU_IFUNC"})

        versions: dict[int, tuple[str, str | None]] = {}
        versym = None
        for sec in sections:
            if isinstance(sec, GNUVerNeedSection):
                for need, auxes in sec.iter_versions():
                    if need.name:
                        facts.version_files.add(need.name)
                    for aux in auxes:
                        versions[aux["vna_other"]] = (aux.name, need.name)
            elif isinstance(sec, GNUVerSymSection):
                versym = sec
        if isinstance(dynsym, SymbolTableSection):
            for i, sym in enumerate(dynsym.iter_symbols()):
                if i == 0:
                    continue
                if sym["st_shndx"] != "SHN_UNDEF":
                    if sym["st_info"]["bind"] != "STB_LOCAL" and sym["st_other"]["visibility"] in (
                            "STV_DEFAULT", "STV_PROTECTED"):
                        facts.exported.append(sym.name)
                    continue
                ndx = versym.get_symbol(i)["ndx"] if versym is not None else 0
                ver, lib = versions.get(ndx & 0x7FFF, ("", "")) if isinstance(ndx, int) else ("", "")
                facts.undefined.append((sym.name, ver, lib or ""))

        relocs: dict[int, tuple[int, int, int]] = {}  # offset -> (type, symbol index, addend)
        reloc_symtab = dynsym
        for sec in sections:
            if isinstance(sec, RelocationSection):
                for r in sec.iter_relocations():
                    kind = r["r_info_type"]
                    if kind in _IRELATIVE.get(facts.machine, ()):
                        facts.irelative += 1
                    relocs[r["r_offset"]] = (kind, r["r_info_sym"], r["r_addend"] if r.is_RELA() else 0)

        tags: dict[str, list[int | str]] = {}
        for sec in sections:
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    t = tag.entry.d_tag
                    if t == "DT_NEEDED":
                        facts.needed.append(tag.needed)  # type: ignore[attr-defined]  # pyelftools sets it
                    elif t in ("DT_RPATH", "DT_RUNPATH", "DT_AUDIT", "DT_DEPAUDIT", "DT_FILTER", "DT_AUXILIARY"):
                        value = getattr(tag, t[3:].lower(), None) or str(tag.entry.d_val)
                        facts.search_tags.append((t, str(value)))
                    tags.setdefault(t, []).append(tag.entry.d_val)
        facts.textrel = "DT_TEXTREL" in tags or any(int(v) & _DT_TEXTREL_FLAG for v in tags.get("DT_FLAGS", []))

        by_addr: dict[int, list[Symbol]] = {}
        for s in facts.symbols:
            if s.type in ("STT_FUNC", "STT_GNU_IFUNC", "STT_NOTYPE") and s.value:
                by_addr.setdefault(s.value, []).append(s)
        word = 8 if elf.elfclass == 64 else 4
        dyn_syms = list(reloc_symtab.iter_symbols()) if isinstance(reloc_symtab, SymbolTableSection) else []

        def target_of(address: int, raw: int) -> Symbol | str:
            kind, sym_index, addend = relocs.get(address, (None, 0, 0))
            if kind is not None and sym_index:
                sym = dyn_syms[sym_index] if sym_index < len(dyn_syms) else None
                if sym is None or sym["st_shndx"] == "SHN_UNDEF":
                    return f"the external symbol {sym.name if sym is not None else sym_index!r}"
                raw = sym["st_value"] + addend
            elif kind in _RELATIVE.get(facts.machine, ()):
                raw = addend or raw
            cands = by_addr.get(raw, [])
            return min(cands, key=lambda s: s.bind != "STB_LOCAL") if cands else f"address {raw:#x}"

        def read_words(address: int, size: int) -> list[int]:
            data = b""
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= address < seg["p_vaddr"] + seg["p_filesz"]:
                    off = seg["p_offset"] + address - seg["p_vaddr"]
                    fh.seek(off)
                    data = fh.read(size)
                    break
            order: Literal["little", "big"] = "little" if elf.little_endian else "big"
            return [int.from_bytes(data[i:i + word], order) for i in range(0, len(data) - word + 1, word)]

        for array in ("init_array", "fini_array", "preinit_array"):
            start, size = tags.get(f"DT_{array.upper()}"), tags.get(f"DT_{array.upper()}SZ")
            entries: list[Symbol | str] = []
            if start:
                n = int(size[0]) // word if size else 0
                words = read_words(int(start[0]), n * word)
                words += [0] * (n - len(words))
                entries = [target_of(int(start[0]) + i * word, words[i]) for i in range(n)]
            facts.arrays[array] = entries
        for which in ("init", "fini"):
            addr = tags.get(f"DT_{which.upper()}")
            if addr:
                setattr(facts, which, target_of(-1, int(addr[0])))

        for seg in elf.iter_segments():
            flags = seg["p_flags"]
            if seg["p_type"] == "PT_GNU_STACK" and flags & _PF_X:
                facts.exec_stack = True
            if seg["p_type"] == "PT_LOAD" and flags & _PF_X and flags & _PF_W:
                facts.wx_segments += 1
    return facts


# -- the checks -------------------------------------------------------------------------------------------


def check(policy: SymbolPolicy, facts: ElfFacts, candidate, rules, target: str) -> list:
    """Every breach of ``policy`` in ``facts`` (see the module docstring), as `static_checks.Finding` records
    of kind ``artifact``; ``rules`` (the target's source rules) explain refused symbols."""
    from ksearch.eval.static_checks import Finding

    out: list[Finding] = []

    def add(rule: str, text: str, why: str, name: str = "") -> None:
        file, line = _named_at(candidate, name) if name else ("", 0)
        out.append(Finding(rule, file, line, text, why, kind="artifact"))

    for lib in facts.needed + sorted(facts.version_files - set(facts.needed)):
        if not policy.library_allowed(lib):
            add("linked-library", f"linked library {lib!r} is not allowed for {target} kernels",
                "a kernel may depend on the C, math, OpenMP and C++ runtime libraries only")
    for tag, value in facts.search_tags:
        add("linked-library", f"{tag} {value!r} is not allowed for {target} kernels",
            "it changes where or which libraries the loader loads")

    seen: set[str] = set()
    for name, version, _lib in facts.undefined:
        if name in seen:
            continue
        seen.add(name)
        allowed, refusing = policy.verdict(name)
        if version == "GLIBC_PRIVATE":
            allowed, refusing = False, None
        if allowed:
            continue
        family, why = _explain(name, refusing, policy, rules)
        add("linked-symbol", f"linked symbol {name!r} is not allowed for {target} kernels", f"{family}: {why}", name)

    for name in dict.fromkeys(facts.exported):
        if name.startswith("_Z"):  # C++: template and inline members the kernel instantiated are its own copies
            continue
        known = next((f for f in policy.symbols + policy.refused if f.regex.fullmatch(name)), None)
        if known is not None:
            what = (known.family, known.why)
        else:
            rule = next((r for r in rules if r.view == "code" and (r.pattern or r.names) and r.regex.fullmatch(name)),
                        None)
            if rule is None:
                continue
            what = (rule.family or rule.id, rule.why)
        add("interpose-libc", f"the built library defines {name!r}, a name of the libraries it links against",
            f"{what[0]}: {what[1]}; a definition could replace the library's for whoever calls it by name", name)

    own = set(candidate.sources)
    lt = policy.load_time
    for array, allowed_calls in (("preinit_array", lt.preinit_array), ("init_array", lt.init_array),
                                 ("fini_array", lt.fini_array)):
        counts: Counter[str] = Counter()
        for entry in facts.arrays.get(array, []):
            problem = _not_startup(entry, own, facts.has_symtab)
            if problem is None and isinstance(entry, Symbol):  # a start-up function is a named symbol
                counts[entry.name] += 1
                if entry.name not in allowed_calls:
                    problem = f"the function {entry.name!r}"
                elif counts[entry.name] > allowed_calls[entry.name]:
                    problem = f"the function {entry.name!r} more often than the compiler's start-up files do"
            if problem is not None:
                add("load-time-code", f".{array} of the built library calls {problem} at load or unload",
                    _LOAD_WHY, entry.name if isinstance(entry, Symbol) else "")
    for which, expected in (("init", lt.init), ("fini", lt.fini)):
        entry = getattr(facts, which)
        if entry is None:
            continue
        problem = _not_startup(entry, own, facts.has_symtab)
        if problem is None and entry.name != expected:
            problem = f"the function {entry.name!r}"
        if problem is not None:
            add("load-time-code", f"DT_{which.upper()} of the built library calls {problem}, not {expected}",
                _LOAD_WHY)
    for sym in facts.symbols:
        if sym.section in (".init", ".fini") and sym.origin in own:
            add("load-time-code", f"function {sym.name!r} of {sym.origin} lies in {sym.section}", _LOAD_WHY, sym.name)
    for legacy in sorted(facts.section_names & {".ctors", ".dtors", ".preinit_array"}):
        add("load-time-code", f"the built library has a {legacy} section", _LOAD_WHY)
    if facts.ifuncs or facts.irelative:
        listed = ", ".join(repr(n) for n in facts.ifuncs[:4]) or f"{facts.irelative} IRELATIVE relocation(s)"
        add("load-time-code", f"the built library has IFUNC symbols ({listed})",
            "an IFUNC resolver runs when the library loads (ifunc, target_clones); -march=native already "
            "targets this machine")

    if facts.exec_stack:
        add("binary-layout", "the built library asks for an executable stack",
            "the loader would make every thread's stack executable (GNU C nested functions whose address is "
            "taken need one: write them as ordinary functions)")
    if facts.wx_segments:
        add("binary-layout", "the built library has a segment both writable and executable",
            "memory that is written and run is how injected code runs")
    if facts.textrel:
        add("binary-layout", "the built library has text relocations",
            "the loader would make its code writable to relocate it")
    return out


_LOAD_WHY = ("code that runs when the library loads or unloads runs before and after any call the judge "
             "makes (constructors, destructors, C++ static initialisers of file-scope objects); compute "
             "inside the entry point")


def _not_startup(entry, own: set[str], has_symtab: bool) -> str | None:
    """Why ``entry`` (an array entry's target) is not a function of the compiler's start-up files, or None."""
    if not has_symtab:
        return "a function it cannot name (the library has no symbol table)"
    if isinstance(entry, str):
        return entry
    if entry.bind != "STB_LOCAL" or entry.origin is None:
        return f"the {entry.bind.removeprefix('STB_').lower()} function {entry.name!r}"
    if entry.origin in own:
        return f"the function {entry.name!r} of {entry.origin}"
    return None


def _explain(name: str, refusing: SymbolFamily | None, policy: SymbolPolicy, rules) -> tuple[str, str]:
    """(family, why) of a refused symbol: the refusing family, an explanation, the first source rule of the
    ``code`` view (then of ``text``) that matches the name, or the allow-list itself."""
    if refusing is not None:
        return refusing.family, refusing.why
    by_id = {r.id: r for r in rules}
    for ex in policy.explain:
        if re.fullmatch(ex.pattern, name) and ex.rule in by_id:
            r = by_id[ex.rule]
            return r.family or r.id, r.why
    bare = name.split("@")[0]
    for view in ("code", "text"):
        for r in rules:
            if r.view == view and (r.pattern or r.names) and r.regex.fullmatch(bare):
                return r.family or r.id, r.why
    families = ", ".join(f.family for f in policy.symbols)
    return "not on the allow-list", f"a kernel may link only these families of functions: {families}"


def _named_at(candidate, name: str) -> tuple[str, int]:
    """(file, line) of the first place the candidate's sources name ``name`` or its undecorated base
    (``__printf_chk`` -> ``printf``), or ("", 0)."""
    from ksearch.eval.c_scan import strip_c

    base = re.sub(r"^(?:__isoc(?:99|23)_|__builtin_|_+)|(?:64)?(?:_chk|_2)?$", "", name.split("@")[0])
    for want in dict.fromkeys([name, base]):
        if not want:
            continue
        pat = re.compile(rf"(?<![\w$]){re.escape(want)}(?![\w$])")
        for file, src in sorted(candidate.sources.items()):
            code = strip_c(src, keep_strings=False)
            m = pat.search(code)
            if m:
                return file, code.count("\n", 0, m.start()) + 1
    return "", 0
