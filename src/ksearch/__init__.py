"""ksearch: world-model-guided search for fast kernels, judged on the real device."""

__version__ = "0.1.0"
