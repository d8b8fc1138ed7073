"""Infrastructure errors, in one place.

Outcomes of a candidate (compile error, wrong answer, timeout, ...) are *not* exceptions: they are
`ksearch.records.Status` values. Exceptions are for the infrastructure around candidates:
a malformed task file, a missing compiler, a worker that could not start, an unknown run.
Every message names the bad value.

Some are signals between two parts of ksearch rather than errors shown to the user (a worker that timed out, an
edit the planner is told was rejected); they keep the base class their callers catch. This module imports only
the standard library: the evaluation worker and the sandbox import it before anything else.
"""

import errno
import signal


class KsearchError(Exception):
    """Base of every error ksearch raises on purpose; the CLI prints it without a traceback."""


class TaskError(KsearchError):
    """A task definition or workload is malformed or unknown."""


class TaskTimeout(TaskError):
    """A task's own code (its reference, input generator, check, problem file) ran past its time limit
    (`ksearch.tasks.guard.task_code`); the message names the code and the limit."""


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


class StoreWriteError(StoreError):
    """The run store could not be written (disk full, quota, permissions, a read-only file system), or its file or
    directory was removed or replaced while the run worked on it. What was committed is kept (the message says
    where): the run stops, and `ksearch resume` continues once the cause is gone."""


#: errno names of a storage failure (a full disk, a quota, permissions, a read-only or failing file system): an
#: OSError with one of these stops a run as `StoreWriteError` does, never as a traceback
STORAGE_ERRNOS = ("ENOSPC", "EDQUOT", "EACCES", "EPERM", "EROFS", "EIO", "EFBIG")
_STORAGE_ERRNO_CODES = frozenset(getattr(errno, n) for n in STORAGE_ERRNOS if hasattr(errno, n))


def storage_failure(e: BaseException) -> bool:
    """Whether ``e`` is a failure of the storage under ksearch (`STORAGE_ERRNOS`), not of ksearch itself."""
    return isinstance(e, OSError) and e.errno in _STORAGE_ERRNO_CODES


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


class TransientLLMError(LLMError):
    """A failure a retry may cure (429, 5xx, timeout, connection reset). ``retry_after_s``: the server's hint."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ReplyError(KnowledgeError):
    """A model's reply that does not hold what was asked for (`ksearch.proposers.llm.parse`); the message says what
    is wrong, for the log and the model alike."""


class ExportError(KsearchError):
    """A run or candidate that cannot be exported (not an mlx target, no best kernel, a bad file)."""


class ReportError(KsearchError):
    """A report that cannot be written where it was asked for (``-o`` naming a directory or a device)."""


class DeviceNeeded(KsearchError):
    """The static pass is done (`ksearch.search.static_pass`); the next step (judging) needs the target's device."""


class PlanError(ValueError):
    """A launch plan that is malformed (a COMPILE_ERROR) or does not resolve for a workload (RUNTIME_ERROR)."""


class Rejected(Exception):
    """An edit of the world model broke a rule (`ksearch.search.edits`); the message is the reason shown to the
    planner."""


class BaselineUnavailable(Exception):
    """A baseline that cannot run here (torch missing, no GPU): the message says why; the run goes on without it."""


class BaselineNotForTarget(BaselineUnavailable):
    """A baseline meant for other targets' runs (MLX's SDPA in a cuda run): skipped quietly where another baseline
    of the task runs."""


class CandidateError(Exception):
    """An exception raised by the candidate's ``run`` (a RUNTIME_ERROR; the triton target's worker side), with the
    candidate's line in the message."""


# -- the evaluation worker, seen from the controller (`ksearch.jail.sandbox`, `ksearch.eval.timing`) ------------


class WorkerTimeout(Exception):
    """The worker did not answer within the deadline (it has been killed)."""


class WorkerStopped(WorkerTimeout):
    """A process of the worker was stopped (SIGSTOP, SIGTSTP) by something other than the judge while a request
    waited: an infrastructure fault, not the kernel's timeout (the worker has been killed)."""


class ProtocolViolation(Exception):
    """A reply that does not answer the request sent (something in the worker wrote to the reply stream)."""


_SIGNAL_HINTS = {"SIGXCPU": "CPU time limit reached", "SIGXFSZ": "file size limit reached",
                 "SIGSYS": "a forbidden system call"}


def describe_exit(returncode: int | None) -> str:
    """A worker's exit in words: ``returncode`` None (it stopped answering), < 0 (the signal that killed it, with
    the resource limit or seccomp filter a signal means), else its exit status."""
    if returncode is None:
        return "worker stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = _SIGNAL_HINTS.get(name)
        return f"worker killed by {name}" + (f" ({hint})" if hint else "")
    return f"worker exited with status {returncode}"


class WorkerDied(Exception):
    """The worker exited while a request was pending: ``returncode`` < 0 is the signal number (None: it closed its
    reply stream or garbled a reply; ``stderr_tail`` then says what); the message is `describe_exit`'s."""

    def __init__(self, returncode: int | None, stderr_tail: str):
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        super().__init__(describe_exit(returncode))


class ExternalKill(Exception):
    """A worker was killed (SIGKILL) or stopped by something other than the judge: an infrastructure fault, not
    the candidate's; the caller judges the workload again on fresh workers. ``role``: whose worker it was."""

    def __init__(self, role: str, message: str):
        self.role = role
        super().__init__(message)
