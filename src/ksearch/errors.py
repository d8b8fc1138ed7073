"""Infrastructure errors, in one place.

Outcomes of a candidate (compile error, wrong answer, timeout, ...) are *not* exceptions: they are
`ksearch.records.Status` values. Exceptions are for the infrastructure around candidates:
a malformed task file, a missing compiler, a worker that could not start, an unknown run.
Every message names the bad value.
"""


class KsearchError(Exception):
    """Base of every error ksearch raises on purpose; the CLI prints it without a traceback."""


class TaskError(KsearchError):
    """A task definition or workload is malformed or unknown."""


class TargetError(KsearchError):
    """A target is unavailable or misconfigured (no compiler, no device)."""


class KernelCompileError(TargetError):
    """A candidate's source did not compile where the target compiles it late (the cuda target compiles in
    the worker, which owns the GPU); the message is the compiler's log. Reported as COMPILE_ERROR."""


class KernelRejected(TargetError):
    """A defense inside the worker caught the candidate (the triton target: torch computing on the GPU, a
    patched clock or stream); the message says what. Reported as REJECTED."""


class UnsupportedOp(TargetError):
    """A runner was asked for what its clock does not do (``prepare``/``go`` of a runner on the device's clock, a
    timed block of one on the controller's: `ksearch.targets.base.Runner`), or out of order (``go`` before
    ``prepare``). The judge's fault, not the candidate's; the message names the runner and the op."""


class HardwareError(KsearchError):
    """The hardware spec could not be detected, measured or loaded."""


class WorkerError(KsearchError):
    """An evaluation worker could not be started or answered nonsense (not a candidate fault)."""


class StoreError(KsearchError):
    """The run store is missing, locked or from an incompatible schema."""


class KnowledgeError(KsearchError):
    """A knowledge pack is malformed, or a pattern could not be rendered."""


class SearchError(KsearchError):
    """The search cannot continue (invalid configuration, no open action and no way to make one)."""


class ConfigError(KsearchError):
    """A setting is unusable (e.g. ``KSEARCH_HOME`` names a directory that cannot be created)."""


class LLMError(KsearchError):
    """A language-model call failed in a way the proposer cannot recover from by asking again."""


class LLMUnavailable(LLMError):
    """The model endpoint stayed down (connection errors, 429/5xx, timeouts) after every retry. The run stops
    cleanly and is resumable."""


class LLMBudgetExhausted(LLMError):
    """A run's --max-cost or --max-tokens is reached. The run stops cleanly and is resumable with a larger
    limit."""
