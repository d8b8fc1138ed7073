"""Drop-in uses of searched kernels in other libraries.

- ``ksearch.integrations.mlx_lm``: mlx-lm's Mamba-1 prefill through a selective-scan kernel
  (``patch_mamba``, ``unpatch_mamba``, ``reference_scan``); needs ``mlx`` and ``mlx-lm``.

Nothing here is imported by the rest of ksearch, and importing this package imports neither MLX nor mlx-lm.
"""
