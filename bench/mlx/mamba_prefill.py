"""mlx-lm Mamba-1 prefill and decode, stock (mlx-lm's per-token loop), vectorized (an associative scan in plain
MLX ops, no custom kernel) and patched (a selective-scan kernel), the last two through
ksearch.integrations.mlx_lm.patch_mamba, on whatever device MLX runs on.

A mamba-370m-shaped model (hidden 1024, 48 layers, d_inner 2048, d_state 16, conv 4, dt rank 64, vocab 50280,
tied embeddings) is built from a config dict with random weights (nothing is downloaded), in float16 by
default. Per prompt length L: prefill tokens/s (a fresh cache, the prompt fed in --prefill-step chunks with the
cache evaluated after each, as mlx-lm's generate_step does), then one warm-up and --decode timed one-token
steps (decode tokens/s; both variants decode through mlx-lm's own code and are fed the same random tokens,
teacher-forced, so that their logits compare step by step). Every forward's result is
``mx.eval``-ed and the stream synchronized before the clock stops (MLX is lazy); one warm-up run per variant
and L first (it also compiles a kernel module's per-shape kernels). The logits of vectorized and patched (last
prefill chunk and every decode step) are compared with stock's: max |diff|, the same relative to max |stock|,
top-1 agreement, pass/fail at --rtol; where stock is skipped (--stock-max-L), patched is compared with vectorized.

The vectorized baseline is ``ksearch.integrations.mlx_scan.reference_scan``: per chunk of --vec-chunk tokens a
Hillis-Steele doubling scan of the (exp(dt A), dt B u) pairs over [batch, dim, chunk, dstate] arrays
(ceil(log2 chunk) steps of MLX ops, no division and no exp of a growing sum, so stable for any decay), the state
carried from chunk to chunk, starting from the cached state (the scan's h0) on each prefill forward. It is what a
careful MLX user writes without a custom kernel; the patched kernel must beat it, not only the token loop.

The same script runs on an Apple GPU (MLX's Metal backend: `pip install mlx mlx-lm`), on NVIDIA (MLX's CUDA
backend: `pip install mlx-cuda-13 mlx-lm`) and on CPU (small sizes only: MLX's CPU backend is slow):

    python bench/mlx/mamba_prefill.py                                  # stock and vectorized only
    python bench/mlx/mamba_prefill.py --scan scan.py                   # + a kernel from `ksearch export RUN`
    python bench/mlx/mamba_prefill.py --Ls 512,1024,2048,4096 --stock-max-L 1024 --batch 1
    python bench/mlx/mamba_prefill.py --layers 2 --Ls 64,128 --vocab 512 --decode 4   # a quick CPU check

Results: a table on stdout, JSON + Markdown under --out (default bench/results) with the device, library
versions, date and the exact command.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import platform
import shlex
import statistics
import sys
import time
import types
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import mlx.core as mx  # noqa: E402


def _import_mamba():
    """mlx_lm.models.mamba; where mlx-lm's package __init__ fails for want of its tokenizer dependencies
    (transformers, huggingface_hub: mlx-lm installed with --no-deps, as on the lent H200), the package is
    stood in for by a bare module so that only the model code is imported. Returns (module, note)."""
    try:
        from mlx_lm.models import mamba as m
        return m, None
    except ImportError as e:
        for k in [k for k in sys.modules if k == "mlx_lm" or k.startswith("mlx_lm.")]:
            del sys.modules[k]
        spec = importlib.util.find_spec("mlx_lm")
        if spec is None:
            raise
        pkg = types.ModuleType("mlx_lm")
        pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["mlx_lm"] = pkg
        from mlx_lm.models import mamba as m
        return m, f"mlx_lm's package __init__ skipped ({e})"


mamba, MLX_LM_NOTE = _import_mamba()

from ksearch.integrations.mlx_lm import load_scan, patch_mamba, reference_scan, unpatch_mamba  # noqa: E402

#: mamba-370m (state-spaces/mamba-370m-hf config), Hugging Face key names
MAMBA_370M = dict(model_type="mamba", vocab_size=50280, hidden_size=1024, intermediate_size=2048, state_size=16,
                  num_hidden_layers=48, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=64,
                  tie_word_embeddings=True)


def build_model(layers: int, dtype, seed: int, vocab: int = MAMBA_370M["vocab_size"]):
    mx.random.seed(seed)
    model = mamba.Model(mamba.ModelArgs.from_dict({**MAMBA_370M, "num_hidden_layers": layers, "vocab_size": vocab}))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def device_info() -> dict:
    info = {"default_device": str(mx.default_device())}
    try:
        info.update({k: v for k, v in mx.device_info().items() if isinstance(v, (str, int, float, bool))})
    except Exception as e:  # older MLX or no GPU backend
        info["device_info_error"] = repr(e)
    info["metal"] = bool(mx.metal.is_available())
    cuda = getattr(mx, "cuda", None)
    info["cuda"] = bool(cuda is not None and cuda.is_available())
    info["backend"] = "metal" if info["metal"] else "cuda" if info["cuda"] else "cpu"
    return info


def versions() -> dict:
    v = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("mlx", "mlx-metal", "mlx-cuda-13", "mlx-cuda-12", "mlx-cpu", "mlx-lm", "ksearch"):
        try:
            v[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    v["mlx.core.__version__"] = mx.__version__
    return v


def prefill(model, toks, step: int):
    """Feed toks [batch, L] in chunks of ``step`` into a fresh cache; returns (last chunk's logits, cache)."""
    cache = model.make_cache()
    L = toks.shape[1]
    logits = None
    for t0 in range(0, L, step):
        logits = model(toks[:, t0:t0 + step], cache)
        mx.eval(logits, [c.cache for c in cache])
    mx.synchronize()
    return logits, cache


def decode(model, cache, toks):
    """One-token forwards feeding toks [batch, steps] one column at a time (the same tokens for stock and patched:
    greedy picks would let one differing argmax send the two variants down different token sequences, whose
    logits then differ for reasons that have nothing to do with the kernel). Returns (logits [steps, batch,
    vocab], wall seconds of each step, each synchronized)."""
    out, step_s = [], []
    for i in range(toks.shape[1]):
        t0 = time.perf_counter()
        logits = model(toks[:, i:i + 1], cache)[:, -1]
        mx.eval(logits, [c.cache for c in cache])
        mx.synchronize()
        step_s.append(time.perf_counter() - t0)
        out.append(logits)
    return (mx.stack(out) if out else None), step_s


def timed(fn, reps: int, budget_s: float) -> tuple[list[float], object]:
    """Run fn() reps times (at least once; stop early past budget_s); wall seconds of each and the last result."""
    times, result, t_start = [], None, time.perf_counter()
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - t_start > budget_s:
            break
    return times, result


def measure(model, toks, args) -> dict:
    """Warm-up, timed prefills, then decode after the last one; every result evaluated."""
    n_tok = toks.shape[0] * toks.shape[1]
    prefill(model, toks, args.prefill_step)  # warm-up (and per-shape kernel compiles)
    times, (logits, cache) = timed(lambda: prefill(model, toks, args.prefill_step), args.reps, args.budget_s)
    dec_logits, dec_s = None, None
    if args.decode:
        vocab = model.args.vocab_size
        feed = mx.random.randint(0, vocab, (toks.shape[0], args.decode + 1), key=mx.random.key(args.seed + 1))
        decode(model, cache, feed[:, :1])  # warm-up step
        dec_logits, dec_steps = decode(model, cache, feed[:, 1:])
        dec_s = sum(dec_steps)
    med = statistics.median(times)
    r = {"prefill_s": times, "prefill_median_s": med, "prefill_tok_s": n_tok / med}
    if dec_s is not None:
        # tokens/s from the median step (a host hiccup in one step does not move it); the mean is kept too
        med_step = statistics.median(dec_steps)
        r.update(decode_steps=args.decode, decode_s=dec_s, decode_tok_s=toks.shape[0] / med_step,
                 decode_tok_s_mean=toks.shape[0] * args.decode / dec_s, decode_ms_per_step=1e3 * med_step)
    return r | {"_logits": logits, "_decode_logits": dec_logits}


def compare(stock: dict, patched: dict, rtol: float) -> dict:
    """Patched (or vectorized) against stock (or vectorized) logits (last prefill chunk and decode steps), in
    float32; the keys say stock and patched whichever the two are."""
    out = {}
    for key, name in (("_logits", "prefill"), ("_decode_logits", "decode")):
        s, p = stock.get(key), patched.get(key)
        if s is None or p is None:
            continue
        s, p = s.astype(mx.float32), p.astype(mx.float32)
        diff = float(mx.abs(s - p).max())
        scale = float(mx.abs(s).max())
        top1 = float((mx.argmax(s, axis=-1) == mx.argmax(p, axis=-1)).astype(mx.float32).mean())
        finite = bool(mx.all(mx.isfinite(p)).item())
        out[name] = {"max_abs_diff": diff, "max_abs_stock": scale, "max_rel_diff": diff / max(scale, 1e-30),
                     "top1_agreement": top1, "finite": finite,
                     "pass": finite and diff <= rtol * max(scale, 1e-30)}
    out["pass"] = all(v["pass"] for v in out.values() if isinstance(v, dict))
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scan", help="a scan module (`ksearch export RUN --out scan.py`): the patched variant; "
                                   "without it only stock and vectorized run")
    ap.add_argument("--vec-chunk", type=int, default=64,
                    help="tokens per chunk of the vectorized baseline's doubling scan (reference_scan's chunk)")
    ap.add_argument("--no-vectorized", action="store_true", help="skip the vectorized MLX-ops baseline")
    ap.add_argument("--Ls", default="512,1024,2048,4096", help="prompt lengths, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=48, help="number of Mamba layers (mamba-370m: 48)")
    ap.add_argument("--vocab", type=int, default=MAMBA_370M["vocab_size"],
                    help="vocabulary size (mamba-370m: 50280); smaller only for quick CPU checks, where the "
                         "logits matmul dominates")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--stock-max-L", type=int, default=None,
                    help="skip stock (and the logits check) above this L; stock is ~T Python steps per layer")
    ap.add_argument("--prefill-step", type=int, default=2048,
                    help="tokens per prefill forward (mlx-lm generate_step's prefill_step_size default: 2048)")
    ap.add_argument("--decode", type=int, default=16, help="decode steps after the prompt (0: none)")
    ap.add_argument("--reps", type=int, default=3, help="timed prefills per variant and L (after one warm-up)")
    ap.add_argument("--budget-s", type=float, default=60.0, help="stop repeating a prefill after this many s")
    ap.add_argument("--rtol", type=float, default=2e-2,
                    help="pass if max |patched - stock| <= rtol * max |stock| (logits)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    Ls = [int(x) for x in args.Ls.split(",") if x.strip()]
    dtype = getattr(mx, args.dtype)
    if args.vec_chunk < 1:
        raise SystemExit(f"--vec-chunk must be >= 1, got {args.vec_chunk}")
    variants = {}  # name -> (scan for patch_mamba, label)
    if not args.no_vectorized:
        vec = functools.partial(reference_scan, chunk=args.vec_chunk)
        variants["vectorized"] = (vec, f"reference_scan, chunk {args.vec_chunk} (an associative scan in plain MLX "
                                       f"ops, ksearch.integrations.mlx_scan; no custom kernel)")
    input_dtypes = {}
    if args.scan:
        _scan, input_dtypes = load_scan(args.scan)  # loaded here to fail early (a module without h0 too)
        variants["patched"] = (args.scan, f"{Path(args.scan).name} (exported kernel module)")
    dev = device_info()
    print(f"device: {dev}\n" + "".join(f"{k}: {lab}\n" for k, (_, lab) in variants.items())
          + f"model: mamba-370m-shaped, {args.layers} layers, vocab {args.vocab}, {args.dtype}, random weights; "
          f"batch {args.batch}", flush=True)
    model = build_model(args.layers, dtype, args.seed, args.vocab)
    rows = []
    for L in Ls:
        toks = mx.random.randint(0, args.vocab, (args.batch, L), key=mx.random.key(args.seed + L))
        row = {"L": L, "batch": args.batch}
        if args.stock_max_L is None or L <= args.stock_max_L:
            unpatch_mamba(model)
            row["stock"] = measure(model, toks, args)
        for name, (scan, _) in variants.items():
            patch_mamba(model, scan)
            row[name] = measure(model, toks, args)
            unpatch_mamba(model)
        row["checks"], row["speedups"] = {}, {}
        for name in variants:
            ref = "stock" if "stock" in row else "vectorized" if name == "patched" and "vectorized" in row else None
            if ref:
                row["checks"][name] = {"against": ref, **compare(row[ref], row[name], args.rtol)}
        for a, b in (("vectorized", "stock"), ("patched", "stock"), ("patched", "vectorized")):
            if a in row and b in row:
                row["speedups"][f"{a}_vs_{b}"] = row[b]["prefill_median_s"] / row[a]["prefill_median_s"]
        for v in ("stock", *variants):
            if v in row:
                row[v] = {k: x for k, x in row[v].items() if not k.startswith("_")}
        rows.append(row)
        print(line(row), flush=True)
    report = {
        "benchmark": "mlx-lm Mamba-1 prefill/decode, stock vs vectorized MLX ops vs patched kernel "
                     "(ksearch.integrations.mlx_lm)",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *argv]),
        "device": dev, "versions": versions(),
        "model": {**MAMBA_370M, "num_hidden_layers": args.layers, "vocab_size": args.vocab, "dtype": args.dtype,
                  "weights": "random", "seed": args.seed},
        "notes": [n for n in (MLX_LM_NOTE,) if n],
        "variants": {k: lab for k, (_, lab) in variants.items()},
        "scan_input_dtypes": {k: str(v) for k, v in input_dtypes.items()},
        "settings": {k: getattr(args, k) for k in ("batch", "prefill_step", "decode", "reps", "budget_s", "rtol",
                                                    "stock_max_L", "vec_chunk")},
        "rows": rows,
    }
    md = markdown(report)
    print("\n" + md)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = out / f"mlx-mamba-prefill-{dev['backend']}-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    base.with_suffix(".md").write_text(md)
    print(f"wrote {base}.json and .md")
    return 0 if all(c["pass"] for r in rows for c in r["checks"].values()) else 1


def _f(x, fmt="{:,.1f}"):
    return "-" if x is None else fmt.format(x)


def _tok_s(row, v, key="prefill_tok_s"):
    return row.get(v, {}).get(key)


def _checks(row) -> str:
    if not row["checks"]:
        return "not checked"
    return ", ".join(f"{k} vs {c['against']} {'pass' if c['pass'] else 'FAIL'}" for k, c in row["checks"].items())


def line(row) -> str:
    sp = row["speedups"]
    return (f"L {row['L']:>5}: prefill tok/s stock {_f(_tok_s(row, 'stock'))}, vectorized "
            f"{_f(_tok_s(row, 'vectorized'))}, patched {_f(_tok_s(row, 'patched'))} (patched "
            f"{_f(sp.get('patched_vs_stock'), '{:.1f}')}x stock, {_f(sp.get('patched_vs_vectorized'), '{:.1f}')}x "
            f"vectorized; vectorized {_f(sp.get('vectorized_vs_stock'), '{:.1f}')}x stock); decode tok/s stock "
            f"{_f(_tok_s(row, 'stock', 'decode_tok_s'))}, vectorized {_f(_tok_s(row, 'vectorized', 'decode_tok_s'))}, "
            f"patched {_f(_tok_s(row, 'patched', 'decode_tok_s'))}; check {_checks(row)}")


def _rel_diff(checks: dict, variant: str) -> str:
    """Largest logits rel. diff of a variant's check and what it was checked against, or -."""
    c = checks.get(variant)
    if c is None:
        return "-"
    worst = max((y.get("max_rel_diff", 0) for y in c.values() if isinstance(y, dict)), default=0)
    return f"{worst:.2e} ({c['against']})"


def markdown(rep) -> str:
    d, m = rep["device"], rep["model"]
    name = d.get("device_name") or d.get("default_device")
    lines = [
        f"# mlx-lm Mamba-1 prefill: stock vs vectorized MLX ops vs patched kernel on {name} ({d['backend']})", "",
        f"- date: {rep['date']}", f"- command: `{rep['command']}`", f"- device: {json.dumps(d)}",
        f"- versions: {json.dumps(rep['versions'])}",
        f"- model: mamba-370m-shaped, {m['num_hidden_layers']} layers, vocab {m['vocab_size']}, {m['dtype']}, "
        f"random weights (seed {m['seed']})",
        "- stock: mlx-lm's own _process_sequence (a Python loop over the tokens)",
        *(f"- {k}: {lab}" for k, lab in rep["variants"].items()),
        f"- settings: {json.dumps(rep['settings'])}",
        *(f"- note: {n}" for n in rep.get("notes", [])),
        "- prefill: a fresh cache, prompt fed in prefill_step chunks, cache evaluated after each (median of the "
        "timed runs, after one warm-up); decode: one-token steps after the prompt fed the same "
        "random tokens in every variant (teacher-forced, so their logits compare), through mlx-lm's own decode code; "
        "decode tok/s = batch / the median step's wall time; logits: max |diff| relative to max |reference| over "
        "the last prefill chunk and the decode steps", "",
        "| batch | L | stock prefill tok/s | vectorized prefill tok/s | patched prefill tok/s | patched / stock | "
        "patched / vectorized | vectorized / stock | decode tok/s (stock / vec / patched) | logits rel diff "
        "(vec / patched) | check |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in rep["rows"]:
        sp = r["speedups"]
        rel = functools.partial(_rel_diff, r["checks"])
        lines.append(
            f"| {r['batch']} | {r['L']} | {_f(_tok_s(r, 'stock'))} | {_f(_tok_s(r, 'vectorized'))} | "
            f"{_f(_tok_s(r, 'patched'))} | {_f(sp.get('patched_vs_stock'), '{:.1f}x')} | "
            f"{_f(sp.get('patched_vs_vectorized'), '{:.2f}x')} | {_f(sp.get('vectorized_vs_stock'), '{:.1f}x')} | "
            f"{_f(_tok_s(r, 'stock', 'decode_tok_s'))} / {_f(_tok_s(r, 'vectorized', 'decode_tok_s'))} / "
            f"{_f(_tok_s(r, 'patched', 'decode_tok_s'))} | {rel('vectorized')} / {rel('patched')} | {_checks(r)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
