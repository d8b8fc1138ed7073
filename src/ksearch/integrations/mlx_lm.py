"""Run mlx-lm's Mamba-1 prefill through a selective-scan kernel instead of its per-token Python loop.

mlx-lm 0.32's ``mlx_lm.models.mamba.MambaBlock._process_sequence`` updates the state one token at a time
(T graph nodes per layer per step of the loop); ``patch_mamba`` replaces that method on each block instance
with one call of a scan that has the ``selective-scan`` / ``selective-scan-fp16`` task contract (the function
an exported kernel module calls ``selective_scan``), for every forward of at least ``min_tokens`` tokens.
Shorter forwards (decode: one token) keep mlx-lm's own code. The cached state goes in as the scan's initial
state ``h0``, so a prompt prefilled in chunks (mlx-lm's generate_step: 2048 tokens a forward) continues each
chunk from the last with no correction after the scan.

    from mlx_lm import load
    from ksearch.integrations.mlx_lm import patch_mamba
    model, tokenizer = load("state-spaces/mamba-370m-hf")
    patch_mamba(model, "scan.py")        # a module written by `ksearch export RUN --out scan.py`

Layouts: mlx-lm keeps activations as [batch, tokens, channels] and B, C as [batch, tokens, dstate]; the
scan takes [batch, dim, seqlen] and [batch, dstate, seqlen]; the block transposes both ways. The state in the
cache stays [batch, dim, dstate] in the model's dtype, as mlx-lm keeps it, so patched and stock forwards can
follow each other on one cache.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

try:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import mamba as _mamba
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"ksearch.integrations.mlx_lm needs mlx and mlx-lm (pip install mlx mlx-lm): {e}") from e

from ksearch.integrations.mlx_scan import reference_scan

__all__ = ["patch_mamba", "unpatch_mamba", "is_patched", "load_scan", "reference_scan", "ScanFn"]

#: the task contract: scan(u, delta, A, B, C, D, z, delta_bias, h0) -> (out, last_state)
ScanFn = Callable[..., tuple]
#: the contract's input names, in call order
INPUT_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
#: dtypes the scan gets when its module declares none (the float32 task's; the block casts nothing else)
_FLOAT32_INPUTS = ("A", "D", "delta_bias", "h0")


def _load_module(path: str) -> types.ModuleType:
    """Import the .py file at ``path`` (absolute), once per version of the file (keyed by its mtime)."""
    return _load_module_version(path, os.stat(path).st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _load_module_version(path: str, mtime_ns: int) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"ksearch_scan_{abs(hash(path)):x}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import a Python module from {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dtype(name: object, key: str) -> mx.Dtype:
    value = getattr(mx, str(name), None)
    if not isinstance(value, mx.Dtype):
        raise ValueError(f"INPUT_DTYPES[{key!r}] = {name!r} is not an MLX dtype name (e.g. 'float16', 'float32')")
    return value


def load_scan(scan: ScanFn | str | os.PathLike | types.ModuleType) -> tuple[ScanFn, dict[str, mx.Dtype]]:
    """The scan function and the dtypes its inputs must have.

    Args:
        scan: a callable with the task contract; a module object; or the path of a ``.py`` module (as
            ``ksearch export`` writes one) defining ``selective_scan`` and optionally ``INPUT_DTYPES``
            (input name -> MLX dtype name). For a callable, ``INPUT_DTYPES`` is looked up on the callable,
            then on the module that defines it.
    Returns:
        (function, {input name: mx.Dtype}); inputs missing from the mapping are passed as they are.
    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: the module has no callable ``selective_scan`` or a malformed ``INPUT_DTYPES``; the scan is
            one of the 8-input contract from before ``h0`` (a module whose ``INPUTS`` lacks it, a function that
            cannot take 9 inputs).
        TypeError: scan is none of the above.
    """
    module = None
    if isinstance(scan, (str, os.PathLike)):
        path = Path(scan).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"scan module {str(scan)!r} does not exist")
        module = _load_module(str(path))
    elif isinstance(scan, types.ModuleType):
        module = scan
    if module is not None:
        fn = getattr(module, "selective_scan", None)
        if not callable(fn):
            raise ValueError(f"scan module {getattr(module, '__file__', module)!r} defines no callable "
                             f"`selective_scan({', '.join(INPUT_NAMES)})`")
        inputs = getattr(module, "INPUTS", None)
        if isinstance(inputs, (list, tuple)) and "h0" not in inputs:
            raise ValueError(f"scan module {getattr(module, '__file__', module)!r} takes the inputs {list(inputs)}: "
                             f"no initial state `h0` (exported before the selective-scan tasks had one?); "
                             f"export the run again")
        dtypes = getattr(module, "INPUT_DTYPES", None)
    elif callable(scan):
        fn = scan
        dtypes = getattr(scan, "INPUT_DTYPES", None)
        if dtypes is None:
            dtypes = getattr(sys.modules.get(getattr(scan, "__module__", None) or ""), "INPUT_DTYPES", None)
    else:
        raise TypeError(f"scan must be a callable, a module or a path to a .py module; got {type(scan).__name__}")
    _check_arity(fn)
    if dtypes is None:
        return fn, {}
    if not isinstance(dtypes, dict) or set(dtypes) - set(INPUT_NAMES):
        raise ValueError(f"INPUT_DTYPES must map some of {list(INPUT_NAMES)} to dtype names; got {dtypes!r}")
    return fn, {k: _dtype(v, k) for k, v in dtypes.items()}


def _check_arity(fn: ScanFn) -> None:
    """Raise ValueError if ``fn`` cannot take the contract's 9 inputs (a scan written for the 8-input contract,
    before ``h0``). Callables whose signature Python cannot read pass."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*INPUT_NAMES)
    except TypeError as e:
        raise ValueError(f"scan {getattr(fn, '__name__', fn)!r}{sig} cannot take the {len(INPUT_NAMES)} inputs "
                         f"({', '.join(INPUT_NAMES)}): {e}. The initial state `h0` is the last one (a scan "
                         f"exported before the selective-scan tasks had it must be exported again)") from None


def _blocks(model) -> list:
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch_mamba expects an mlx-lm Mamba model (mlx.nn.Module); got {type(model).__name__}")
    blocks = [m for m in model.modules() if isinstance(m, _mamba.MambaBlock)]
    if not blocks:
        kinds = sorted({type(m).__name__ for m in model.modules()})[:8]
        raise TypeError(f"no mlx_lm.models.mamba.MambaBlock in {type(model).__name__} (modules: {kinds}); "
                        f"patch_mamba supports mlx-lm's Mamba-1 models (model_type mamba, falcon_mamba) only")
    return blocks


def patch_mamba(model, scan: ScanFn | str | os.PathLike | types.ModuleType, *, min_tokens: int = 2) -> int:
    """Make every Mamba-1 block of ``model`` run forwards of >= min_tokens tokens through ``scan``.

    Patches instances, not the class: other models are untouched; patching again replaces the scan.
    Numerics: the same as mlx-lm's loop up to rounding (the scan keeps its state in float32 where mlx-lm keeps
    it in the model's dtype; the cache still receives the model's dtype).

    Args:
        model: an mlx-lm Mamba-1 ``Model`` (or any module containing ``mlx_lm.models.mamba.MambaBlock``s);
            falcon_mamba's ``use_bcdt_rms`` blocks are supported.
        scan: see ``load_scan``: a callable with the task contract, a module, or a path to a ``.py`` module.
        min_tokens: forwards with fewer tokens than this use mlx-lm's own code (>= 1; default 2: decode steps
            stay stock).
    Returns:
        the number of blocks patched.
    Raises:
        TypeError: model holds no MambaBlock, or scan is of the wrong kind.
        ValueError: min_tokens < 1, a malformed scan module, or a scan without ``h0`` (see ``load_scan``).
    """
    if not isinstance(min_tokens, int) or min_tokens < 1:
        raise ValueError(f"min_tokens must be an int >= 1, got {min_tokens!r}")
    blocks = _blocks(model)
    fn, dtypes = load_scan(scan)
    for block in blocks:
        # an instance attribute shadows the class's method; nn.Module keeps non-array attributes out of
        # its parameter tree, so saving or updating weights is unaffected
        block._process_sequence = functools.partial(_process_sequence, block, fn, dtypes, min_tokens)
    return len(blocks)


def unpatch_mamba(model) -> int:
    """Undo ``patch_mamba``: every block uses mlx-lm's own ``_process_sequence`` again.

    Returns:
        the number of blocks that were patched. Raises TypeError as ``patch_mamba`` does.
    """
    n = 0
    for block in _blocks(model):
        if "_process_sequence" in vars(block):
            del vars(block)["_process_sequence"]
            n += 1
    return n


def is_patched(model) -> bool:
    """Whether any Mamba-1 block of ``model`` is patched."""
    return any("_process_sequence" in vars(b) for b in _blocks(model))


def _process_sequence(block, scan: ScanFn, dtypes: dict, min_tokens: int, x, conv_cache, state_cache):
    """``MambaBlock._process_sequence`` with the scan in place of the token loop.

    Args:
        x: [batch, T, hidden] (the block's input after the norm).
        conv_cache: [batch, conv_kernel - 1, intermediate] or None.
        state_cache: [batch, intermediate, state_size] or None (zeros); the scan's h0.
    Returns:
        (out [batch, T, hidden], (new_conv_cache, new_state)), as mlx-lm's method.
    """
    T = x.shape[1]
    if T < min_tokens:
        return _mamba.MambaBlock._process_sequence(block, x, conv_cache, state_cache)
    # -- identical to mlx-lm up to the token loop --
    xz = block.in_proj(x)
    x, z = xz.split(indices_or_sections=2, axis=-1)
    K = block.conv_kernel_size
    if conv_cache is not None:
        x_full = mx.concatenate([conv_cache, x], axis=1)
    else:
        x_full = mx.pad(x, [(0, 0), (K - 1, 0), (0, 0)])
    conv_out = block.conv1d(x_full)
    new_conv_cache = x_full[:, -(K - 1):, :]
    u = nn.silu(conv_out)  # [batch, T, intermediate]
    # -- ssm_step's projections, for all tokens at once --
    r, N = block.time_step_rank, block.ssm_state_size
    delta_r, Bm, Cm = mx.split(block.x_proj(u), [r, r + N], axis=-1)
    if block.use_bcdt_rms:
        eps = block.args.mixer_rms_eps
        delta_r = mx.fast.rms_norm(delta_r, weight=None, eps=eps)
        Bm = mx.fast.rms_norm(Bm, weight=None, eps=eps)
        Cm = mx.fast.rms_norm(Cm, weight=None, eps=eps)
    # dt_proj with its bias, in the model's dtype as mlx-lm computes it (works for quantized layers too);
    # the scan's delta_bias is then zero
    delta = block.dt_proj(delta_r)
    dim = u.shape[-1]
    args = {
        "u": u.transpose(0, 2, 1),
        "delta": delta.transpose(0, 2, 1),
        "A": -mx.exp(block.A_log.astype(mx.float32)),
        "B": Bm.transpose(0, 2, 1),
        "C": Cm.transpose(0, 2, 1),
        "D": block.D.astype(mx.float32),
        "z": z.transpose(0, 2, 1),
        "delta_bias": mx.zeros((dim,), dtype=mx.float32),
        "h0": (mx.zeros((u.shape[0], dim, N), dtype=mx.float32) if state_cache is None
               else state_cache.astype(mx.float32)),
    }
    for name, dtype in dtypes.items():
        if args[name].dtype != dtype:
            args[name] = args[name].astype(dtype)
    out, last_state = scan(*(args[k] for k in INPUT_NAMES))
    batch = u.shape[0]
    if tuple(out.shape) != (batch, dim, T) or tuple(last_state.shape) != (batch, dim, N):
        raise ValueError(f"scan {getattr(scan, '__name__', scan)!r} returned out {tuple(out.shape)} and "
                         f"last_state {tuple(last_state.shape)}; expected {(batch, dim, T)} and {(batch, dim, N)}")
    y = out.transpose(0, 2, 1).astype(u.dtype)  # already gated: (y + D*u) * silu(z) == swiglu(z, y + D*u)
    # mlx-lm's state has the activations' dtype; keep it so stock decode steps see what they would have
    return block.out_proj(y), (new_conv_cache, last_state.astype(u.dtype))
