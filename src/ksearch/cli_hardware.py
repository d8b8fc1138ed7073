"""`ksearch hardware ...`: the local hardware spec and its measured ceilings, and the datasheet catalog.

- `ksearch hardware list [--json] [--refresh]`: catalog entries plus the local devices (CPU always, GPU when CuPy
  sees one), from the cache of measured specs; `--refresh` measures them again.
- `ksearch hardware show [NAME] [--json]`: one catalog entry with the source of every figure; without NAME the
  local device with its measured ceilings (`--gpu`, `--refresh` as before).
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from ksearch.errors import KsearchError
from ksearch.hardware.cache import cached_local_spec, load_or_measure
from ksearch.hardware.spec import HardwareSpec

app = typer.Typer(help="The local device (detected facts, measured ceilings) and the catalog of known devices.")


@app.callback()
def _group() -> None:
    """The local device (detected facts, measured ceilings) and the catalog of known devices."""


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def facts_table(spec: HardwareSpec) -> Table:
    """Detected facts of `spec` as a rich table."""
    table = Table(title=f"{spec.name} ({spec.kind})", show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    table.add_row("vendor / model", f"{spec.vendor} / {spec.model}")
    table.add_row("cores / threads", f"{spec.cores} / {spec.threads}")
    if spec.simd_isa:
        table.add_row("SIMD ISA", ", ".join(spec.simd_isa))
    width = f"{spec.simd_width_bits} bits, " if spec.simd_width_bits else ""
    table.add_row("SIMD width", f"{width}{spec.simd_width} float32 lanes")
    for c in spec.caches:
        table.add_row(f"L{c.level} {c.kind}", f"{_size(c.size_bytes)}, shared by {c.shared_by_cores} core(s)")
    if spec.shared_memory_per_block_bytes:
        table.add_row("shared memory / block", _size(spec.shared_memory_per_block_bytes))
    if spec.max_threads_per_block:
        table.add_row("max threads / block", str(spec.max_threads_per_block))
    table.add_row("source", spec.source)
    if spec.provisional:
        table.add_row("provisional", f"not cached, measured again by the next process: {spec.provisional}")
    return table


def ceilings_table(spec: HardwareSpec) -> Table:
    """Each ceiling of `spec` with how it was measured (or its source) as a rich table."""
    table = Table(title="ceilings")
    for col in ("ceiling", "best", "median", "how measured"):
        table.add_column(col)
    rows = [("memory_bandwidth_gbs", spec.memory_bandwidth_gbs, "GB/s")]
    rows += [(f"peak_flops.{dtype}", rate / 1e9, "GFLOP/s") for dtype, rate in spec.peak_flops.items()]
    if spec.exp_rate_per_s:
        rows.append(("exp_rate_per_s", spec.exp_rate_per_s / 1e9, "Gexp/s"))
    rows += [(f"cache_bandwidth_gbs.{k}", c.gbs, "GB/s") for k, c in spec.cache_bandwidth_gbs.items()]
    for key, value, unit in rows:
        m = spec.measured.get(key)
        if m is None:
            table.add_row(key, f"{value:.1f} {unit}", "", spec.source_of(key))
            continue
        median = m.median * value / m.best
        how = f"{m.probe}, {m.threads} threads, {m.repeats} repeats in {m.runs} run(s)"
        if m.busy_cores is not None:
            how += f", others' load {m.busy_cores:.2f} cores"
        level = spec.cache_bandwidth_gbs.get(key.split(".", 1)[1]) if key.startswith("cache_bandwidth") else None
        if level is not None:
            how += f", for working sets up to {_size(level.capacity_bytes)} x FIT_SLACK"
        if m.bytes:
            how += f", {m.bytes / 1e6:.0f} MB" if m.bytes >= 1e6 else f", {_size(m.bytes)}"
        how += f"; {' '.join(m.compile_flags)}" + (f"\n{m.notes}" if m.notes else "")
        table.add_row(key, f"{value:.1f} {unit}", f"{median:.1f}", how)
    return table


@app.command()
def show(
    name: str = typer.Argument(None, help="A catalog entry (e.g. h100, m2-max); omitted: the local device."),
    refresh: bool = typer.Option(False, "--refresh", help="Re-measure the ceilings even when cached."),
    as_json: bool = typer.Option(False, "--json", help="Print the spec as JSON."),
    gpu: bool = typer.Option(False, "--gpu", help="The local NVIDIA GPU's spec only (needs CuPy and a GPU)."),
) -> None:
    """Print a catalog entry with its sources (NAME), or the local hardware spec: detected facts, then each measured
    ceiling and how it was measured."""
    err = Console(stderr=True)
    if name is not None:
        if gpu or refresh:
            err.print("[red]error:[/red] --gpu and --refresh apply to the local device, not to a catalog entry")
            raise typer.Exit(2)
        _show_entry(name, as_json, err)
        return
    if gpu:
        _print_spec(_load_gpu, refresh, as_json, err)
        return
    _print_spec(_load_cpu, refresh, as_json, err)
    if as_json:
        return
    from ksearch.targets.cuda import cupy_status

    if cupy_status() is None:  # a GPU is present: show its spec too
        _print_spec(_load_gpu, refresh, False, err)


def _load_cpu(refresh: bool, err: Console):
    spec = None if refresh else cached_local_spec()
    if spec is None:
        with err.status("measuring ceilings (a few seconds)..."):
            spec = load_or_measure(refresh=True)
    return spec


def _load_gpu(refresh: bool, err: Console):
    from ksearch.hardware.gpu import load_or_measure_gpu

    with err.status("GPU: detecting and measuring ceilings (about a second)..."):
        return load_or_measure_gpu(refresh=refresh)


def _print_spec(load, refresh: bool, as_json: bool, err: Console) -> None:
    """Load a spec (CPU or GPU) and print it as tables or JSON; a KsearchError is one line and exit 2."""
    try:
        spec = load(refresh, err)
    except KsearchError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(spec.model_dump_json(indent=2))
        return
    out = Console()
    out.print(facts_table(spec))
    out.print(ceilings_table(spec))


# --- the catalog ---------------------------------------------------------------------------------------------------


def _fmt(figure: str, value: float) -> str:
    """A catalog figure in readable units."""
    from ksearch.hardware.catalog import FIGURES

    unit = FIGURES[figure][0]
    if unit == "FLOP/s":
        return f"{value / 1e12:g} TFLOP/s"
    if unit == "exp/s":
        return f"{value / 1e12:g} Texp/s"
    if unit == "B":
        return _size(int(value))
    return f"{value:g} {unit}".strip()


def _entry_or_exit(name: str, err: Console):
    from ksearch.hardware import catalog

    try:
        return catalog.get(name)
    except KsearchError as exc:
        err.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2) from exc


def _show_entry(name: str, as_json: bool, err: Console) -> None:
    entry = _entry_or_exit(name, err)
    if as_json:
        typer.echo(entry.model_dump_json(indent=2))
        return
    from ksearch.hardware.catalog import FIGURES

    model = entry.model if entry.model.startswith(entry.vendor) else f"{entry.vendor} {entry.model}"
    table = Table(title=f"{entry.name}: {model}" + (f" ({entry.arch})" if entry.arch else ""))
    table.add_column("figure", no_wrap=True)
    table.add_column("value", no_wrap=True)
    table.add_column("source", overflow="fold")
    for key in FIGURES:  # a fixed order
        fig = entry.figures.get(key)
        if fig is None:
            continue
        if fig.value is None:
            table.add_row(key, "unknown", fig.note or "")
            continue
        where = fig.source or ""
        if fig.derived:
            where += f"\nderived: {fig.derived}"
        if fig.note:
            where += f"\nnote: {fig.note}"
        table.add_row(key, _fmt(key, fig.value), where)
    out = Console()
    out.print(table)
    if entry.aliases:
        out.print(f"aliases: {', '.join(entry.aliases)}")


def _local_devices(refresh: bool, err: Console) -> list[dict]:
    """The local CPU (always) and GPU (when CuPy sees one): cached measured specs, else detected facts only."""
    from ksearch.hardware.cpu import detect_cpu

    devices: list[dict] = []
    try:
        spec = _load_cpu(True, err) if refresh else cached_local_spec()
    except KsearchError as exc:
        spec, why = None, str(exc)
    else:
        why = "not measured yet: `ksearch hardware show` measures it"
    if spec is not None:
        devices.append({"name": spec.name, "kind": "cpu", "model": spec.model, "measured": True,
                        "spec": spec.model_dump(mode="json")})
    else:
        info = detect_cpu()
        devices.append({"name": "local-cpu", "kind": "cpu", "model": info.model, "measured": False, "note": why,
                        "facts": info.model_dump(mode="json")})
    from ksearch.targets.cuda import cupy_status

    if cupy_status() is None:
        from ksearch.hardware.cache import load_spec
        from ksearch.hardware.gpu import gpu_facts, gpu_fingerprint

        try:
            facts = gpu_facts()
            gspec = _load_gpu(True, err) if refresh else load_spec(gpu_fingerprint(facts))
        except KsearchError as exc:
            devices.append({"name": "local-gpu", "kind": "gpu", "model": "", "measured": False, "note": str(exc)})
        else:
            if gspec is not None:
                devices.append({"name": gspec.name, "kind": "gpu", "model": gspec.model, "measured": True,
                                "spec": gspec.model_dump(mode="json")})
            else:
                devices.append({"name": "local-gpu", "kind": "gpu", "model": facts["name"], "measured": False,
                                "note": "not measured yet: `ksearch hardware show --gpu` measures it", "facts": facts})
    return devices


@app.command("list")
def list_(
    as_json: bool = typer.Option(False, "--json", help="Print the catalog and the local devices as JSON."),
    refresh: bool = typer.Option(False, "--refresh", help="Measure the local devices again (else the cache is used)."),
) -> None:
    """List the catalog's devices and the local ones (the CPU always, the GPU when CuPy sees one)."""
    from ksearch.hardware import catalog

    err = Console(stderr=True)
    try:
        entries = catalog.entries()
    except KsearchError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    local = _local_devices(refresh, err)
    if as_json:
        rows = [{"name": e.name, "aliases": e.aliases, "vendor": e.vendor, "model": e.model, "arch": e.arch,
                 "kind": e.kind, "figures": {k: f.value for k, f in e.figures.items()}} for e in entries]
        typer.echo(json.dumps({"catalog": rows, "local": local}, indent=2))
        return
    table = Table(title="hardware catalog (`ksearch hardware show NAME` for every figure's source)")
    for col in ("name", "model", "cores", "GB/s", "FP32 TFLOP/s", "BF16/FP16 TFLOP/s", "smem/block", "aliases"):
        table.add_column(col)

    def num(v: float | None, scale: float = 1.0) -> str:
        return "-" if v is None else f"{v / scale:g}"

    for e in entries:
        half = e.value("peak_flops.tensor_bfloat16") or e.value("peak_flops.bfloat16") or e.value(
            "peak_flops.float16")
        static, optin = e.int_value("shared_memory_per_block_bytes"), e.int_value("shared_memory_per_block_optin_bytes")
        smem = "-" if static is None else _size(static) + (f" ({_size(optin)} opt-in)" if optin and optin != static
                                                            else "")
        model = e.model if e.model.startswith(e.vendor) else f"{e.vendor} {e.model}"
        table.add_row(e.name, model, num(e.value("cores")), num(e.value("memory_bandwidth_gbs")),
                      num(e.value("peak_flops.float32"), 1e12), num(half, 1e12), smem, ", ".join(e.aliases))
    out = Console()
    out.print(table)
    loc = Table(title="local devices")
    for col in ("name", "kind", "model", "GB/s", "FP32 GFLOP/s", "status"):
        loc.add_column(col)
    for d in local:
        spec = d.get("spec")
        if spec:
            loc.add_row(d["name"], d["kind"], d["model"], f"{spec['memory_bandwidth_gbs']:.1f}",
                        f"{spec['peak_flops'].get('float32', 0) / 1e9:.1f}", "measured (cached)")
        else:
            loc.add_row(d["name"], d["kind"], d["model"], "-", "-", d.get("note", ""))
    out.print(loc)
