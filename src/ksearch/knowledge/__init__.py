"""Knowledge packs: code patterns with knobs (data files) and the renderer that composes them into kernels."""

from ksearch.knowledge.pack import (
    Choice,
    Decision,
    Family,
    Knob,
    Pack,
    RenderedKernel,
    ResolvedPath,
    load_pack,
    load_pack_file,
)

__all__ = ["Choice", "Decision", "Family", "Knob", "Pack", "RenderedKernel", "ResolvedPath", "load_pack",
           "load_pack_file"]
