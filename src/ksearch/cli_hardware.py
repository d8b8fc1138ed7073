"""`ksearch hardware ...`: show the local hardware spec and its measured ceilings."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from ksearch.errors import KsearchError
from ksearch.hardware.cache import cached_local_spec, load_or_measure
from ksearch.hardware.spec import HardwareSpec

app = typer.Typer(help="The local device: detected facts and measured ceilings (bandwidth, FLOP/s, exp rate).")


@app.callback()
def _group() -> None:
    """The local device: detected facts and measured ceilings."""


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
    for key, value, unit in rows:
        m = spec.measured.get(key)
        if m is None:
            table.add_row(key, f"{value:.1f} {unit}", "", spec.source_of(key))
            continue
        median = m.median * value / m.best
        how = f"{m.probe}, {m.threads} threads, {m.repeats} repeats"
        if m.bytes:
            how += f", {m.bytes / 1e6:.0f} MB" if m.bytes >= 1e6 else f", {_size(m.bytes)}"
        how += f"; {' '.join(m.compile_flags)}" + (f"\n{m.notes}" if m.notes else "")
        table.add_row(key, f"{value:.1f} {unit}", f"{median:.1f}", how)
    return table


@app.command()
def show(
    refresh: bool = typer.Option(False, "--refresh", help="Re-measure the ceilings even when cached."),
    as_json: bool = typer.Option(False, "--json", help="Print the spec as JSON."),
    gpu: bool = typer.Option(False, "--gpu", help="The local NVIDIA GPU's spec only (needs CuPy and a GPU)."),
) -> None:
    """Print the local hardware spec: detected facts, then each measured ceiling and how it was measured."""
    err = Console(stderr=True)
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
