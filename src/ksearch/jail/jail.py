"""Inside the worker (and the compiler), before any candidate code runs: namespaces, a reduced read-only file
system, no privileges.

`enter` runs first in ``python -m ksearch.eval.worker``, single-threaded, with the policy the controller gave
on the command line (see `sandbox.Policy`); `launch` is the compile jail's launcher (`ksearch.jail.compile_jail`),
which enters the jail and then execs the compiler. Linux only;
every step that the system refuses is skipped and reported, never fatal. What it does, in order:

1. ``unshare(2)`` new user, mount, network, PID and IPC namespaces (without the user namespace when that is
   refused and we are root; nothing when both are refused). The process (P0) forks P1, the PID namespace's
   init, and waits for it; P0 dies by the same signal as the worker, so the controller sees the worker's
   own exit status.
2. P1 (PID 1) makes every mount private, mounts a fresh /proc (only the namespace's processes are visible)
   and sets the namespace's ``pid_max``. With ``view="reduced"`` (`_reduced_view`) it assembles a new root
   on a tmpfs: read-only bind mounts of the paths the policy names (the system's libraries, the interpreter,
   ksearch, the build, the inputs; never ``/`` nor a directory holding the invoking user's home), read-write
   bind mounts of the output files (or the build directory), the usable device nodes, a fresh /proc and a
   size-limited tmpfs as home, symbolic links on the way recreated, and pivot_roots into it, detaching the
   host's tree. Otherwise (``view="host"``, or when the new root fails) it masks the user's home with an
   empty tmpfs (re-exposing what the worker needs) and remounts every mount read-only, nosuid, nodev, except
   the home tmpfs, the output files and /dev/null, zero, full, random, urandom. It forks P2 and waits; when
   P2 exits, P1 exits and the kernel kills whatever is left in the namespace (escaped, re-parented or
   daemonized descendants included).
3. P2 (the worker, or the compiler about to be exec'd) drops every capability (bounding set, permitted,
   effective, inheritable, ambient), sets no-new-privileges, installs a seccomp filter (x86-64 only; the
   ``worker`` profile refuses new processes (threads are allowed), exec, sockets, ptrace and cross-process
   memory access, namespace and mount calls, module loading, reboot, kexec, bpf, perf and keyrings; the
   ``compile`` profile allows fork, exec and signals, nothing else more); then sets resource limits (core 0,
   address space, file size, CPU time, process count) and returns its report.

Without the namespaces (step 1 refused) steps 2 is skipped and step 3 runs in P0 itself. Everything this
module needs is imported before the new root hides the interpreter (the compile jail's view holds none).
"""

from __future__ import annotations

import _signal as signal  # the C module: `signal` builds enums, 4 ms of the compile jail's start
import ctypes
import errno
import os
import resource
import struct
import sys

from ksearch.jail.jail_fs import check, file_system, libc, write_file

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 22, 38, 47, 4
SECCOMP_MODE_FILTER = 2

#: x86-64 system calls the seccomp filter refuses with EPERM (numbers from the kernel's syscall_64.tbl);
#: clone is allowed only with CLONE_THREAD, clone3 answers ENOSYS so that libc falls back to clone.
_X86_64_DENY = {
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
    "socket": 41, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169, "kexec_load": 246,
    "kexec_file_load": 320, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250,
    "add_key": 248, "request_key": 249, "swapon": 167, "swapoff": 168, "acct": 163,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "fsopen": 430, "fsmount": 432, "move_mount": 429,
    "open_tree": 428, "tkill": 200, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434,
    "pidfd_send_signal": 424, "pidfd_getfd": 438,
}
_X86_64_CLONE, _X86_64_CLONE3, _X86_64_KILL, _X86_64_TGKILL = 56, 435, 62, 234
#: what the compile's profile allows of `_X86_64_DENY` (the driver starts cc1, as, collect2 and ld)
_COMPILE_ALLOWS = {"fork", "vfork", "execve", "execveat", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"}
#: clone flags that make new namespaces (CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET)
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_AUDIT_ARCH_X86_64 = 0xC000003E


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    check(libc.prctl(option, arg2, arg3, 0, 0), f"prctl({option})")


# -- step 1: namespaces -----------------------------------------------------------------------------------


def _unshare(with_user: bool) -> None:
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | (CLONE_NEWUSER if with_user else 0)
    check(libc.unshare(flags), "unshare")
    if with_user:  # we become root of the new namespace, mapped to the same outside user
        write_file("/proc/self/setgroups", "deny")
        write_file("/proc/self/uid_map", f"0 {uid} 1")
        write_file("/proc/self/gid_map", f"0 {gid} 1")


def _namespaces(policy: dict, report: dict) -> bool:
    """Step 1; True when the namespaces exist (the caller then forks the namespace's init)."""
    if policy.get("namespaces", "auto") == "off" or sys.platform != "linux":
        report["errors"].append("namespaces: switched off" if sys.platform == "linux" else "namespaces: not Linux")
        return False
    tries = [True, False] if os.geteuid() == 0 else [True]
    if policy.get("namespaces") == "no-user":
        tries = [False]
    for with_user in tries:
        try:
            _unshare(with_user)
        except OSError as e:
            report["errors"].append(f"namespaces{' with user' if with_user else ''}: {e}")
            continue
        report["namespaces"] = (["user"] if with_user else []) + ["mount", "net", "pid", "ipc"]
        return True
    return False


def _wait_and_mirror(child: int, devnull: int) -> None:
    """P0: wait for P1 and end the way it did (a signal as that signal; see `_init_exit_code`)."""
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # only the worker may hold the protocol pipes: its death must close them
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code > 128:  # P1 encodes the worker's fatal signal as 128 + signal
        code = -(code - 128)
    if code < 0:
        sig = -code
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(code)


# -- step 2: the namespace's init and its file system -----------------------------------------------------


def _init_exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 + (-code) if code < 0 else min(code, 127)


def _be_init(child: int, devnull: int) -> None:
    """P1 after forking the worker: reap every process and exit when the worker does."""
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            os._exit(_init_exit_code(status))  # the kernel then kills the rest of the namespace


# -- step 3: the worker drops everything ------------------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(report: dict, privileged: bool) -> None:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except OSError:
        last = 40
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() not in (errno.EINVAL,):
            if not privileged:  # an ordinary user outside any user namespace: nothing to drop
                break
            report["errors"].append(f"capability bounding set: cannot drop {cap}")
            break
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    check(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")  # _LINUX_CAPABILITY_VERSION_3
    report["capabilities"] = "none"


def _assemble(prog: list[tuple]) -> bytes:
    """Classic BPF from (code, jt, jf, k) tuples whose jt/jf may be label names; ("label", name) marks a place."""
    labels, at = {}, 0
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = at
        else:
            at += 1
    out, at = [], 0
    for ins in prog:
        if ins[0] == "label":
            continue
        code, jt, jf, k = ins
        jt = labels[jt] - at - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - at - 1 if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256, "BPF jumps go forward only"
        out.append(struct.pack("=HBBI", code, jt, jf, k))
        at += 1
    return b"".join(out)


def _seccomp_program(own_pid: int, profile: str = "worker") -> bytes | None:
    """The filter as bytes (struct sock_filter[]), or None on an architecture we have no table for.

    Denied calls answer EPERM; clone3 answers ENOSYS so that libc falls back to clone; x32 calls and other
    ABIs are refused. ``worker``: clone only with CLONE_THREAD (threads, no processes), kill and tgkill
    only aimed at ``own_pid``. ``compile``: the compiler driver runs cc1, as and ld, so fork, vfork, exec
    and signals are allowed (the PID namespace confines them), and clone is refused only with a namespace
    flag; everything else of `_X86_64_DENY` stays refused (sockets, ptrace, mounts, ...).
    """
    if os.uname().machine not in ("x86_64", "AMD64"):
        return None
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS, 0x80000000
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    worker = profile == "worker"
    prog: list[tuple] = [
        (ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH_X86_64), (ret, 0, 0, kill),
        (ld, 0, 0, 0), (jge, "deny", 0, 0x40000000),
        (jeq, "clone", 0, _X86_64_CLONE), (jeq, "nosys", 0, _X86_64_CLONE3),
    ]
    if worker:
        prog += [(jeq, "self", 0, _X86_64_KILL), (jeq, "self", 0, _X86_64_TGKILL)]
    denied = _X86_64_DENY if worker else {k: v for k, v in _X86_64_DENY.items() if k not in _COMPILE_ALLOWS}
    prog += [(jeq, "deny", 0, nr) for nr in sorted(set(denied.values()))]
    prog += [(ret, 0, 0, allow), ("label", "clone"), (ld, 0, 0, 16)]
    if worker:
        prog += [(jset, 0, "deny", CLONE_THREAD), (ret, 0, 0, allow),
                 ("label", "self"), (ld, 0, 0, 16), (jeq, 0, "deny", own_pid), (ret, 0, 0, allow)]
    else:
        prog += [(jset, "deny", 0, _CLONE_NAMESPACES), (ret, 0, 0, allow)]
    prog += [("label", "nosys"), (ret, 0, 0, enosys), ("label", "deny"), (ret, 0, 0, eperm)]
    return _assemble(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp(report: dict, profile: str) -> None:
    prog = _seccomp_program(os.getpid(), profile)
    if prog is None:
        report["errors"].append(f"seccomp: no system call table for {os.uname().machine}")
        return
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.addressof(buf))
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp")
    if profile == "worker":
        report["seccomp"] = sorted(_X86_64_DENY) + ["clone without CLONE_THREAD", "clone3", "kill/tgkill of others"]
    else:
        report["seccomp"] = sorted(set(_X86_64_DENY) - _COMPILE_ALLOWS) + ["clone with a namespace flag", "clone3"]


def _user_tasks(uid: int) -> int:
    """Processes and threads the user ``uid`` runs now (RLIMIT_NPROC counts them all, outside a user namespace)."""
    n = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields.get("Threads", "1"))
        except (OSError, ValueError, KeyError):
            continue
    return n


def _limits(policy: dict, report: dict) -> None:
    nproc = policy.get("nproc")
    if nproc is not None and not report["namespaces"] and os.geteuid() != 0:
        nproc = int(nproc) + _user_tasks(os.geteuid())  # the limit counts the user's other processes too
    limits = {
        "core": (resource.RLIMIT_CORE, 0),
        "address_space": (resource.RLIMIT_AS, policy.get("address_space_bytes")),
        "file_size": (resource.RLIMIT_FSIZE, policy.get("file_size_bytes")),
        "cpu_s": (resource.RLIMIT_CPU, policy.get("cpu_s")),
        "nproc": (resource.RLIMIT_NPROC, nproc),
    }
    for name, (which, value) in limits.items():
        if value is None:
            continue
        value = int(value)
        hard = value + 5 if which == resource.RLIMIT_CPU else value  # SIGXCPU at the soft limit, not SIGKILL
        try:
            resource.setrlimit(which, (value, hard))
            report["limits"][name] = value
        except (OSError, ValueError) as e:
            report["errors"].append(f"rlimit {name}: {e}")


def _lock_down(policy: dict, report: dict) -> None:
    try:
        _drop_capabilities(report, privileged=os.geteuid() == 0)
    except OSError as e:
        report["errors"].append(str(e))
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if policy.get("seccomp", True):
            _seccomp(report, policy.get("seccomp_profile", "worker"))
        else:
            report["errors"].append("seccomp: switched off")
    except OSError as e:
        report["errors"].append(str(e))
    _limits(policy, report)
    cwd = policy.get("cwd") or policy.get("home")
    if cwd:
        os.chdir(cwd)  # again: a tmpfs or a new root may now cover the directory we started in


def enter(policy: dict) -> dict:
    """Sandbox this process as `policy` says; returns (in the worker only) what was enforced.

    The report: ``namespaces`` (list), ``read_only_fs`` (bool), ``view`` (with ``view="reduced"``: the
    host paths still visible; empty: all of the host's file system), ``writable`` (paths), ``hidden``
    (paths), ``capabilities``, ``seccomp`` (refused calls), ``limits`` (name -> value), ``pid_max``,
    ``errors`` (every step the system refused, in words).
    """
    report: dict = {"namespaces": [], "read_only_fs": False, "view": [], "writable": [], "hidden": [],
                    "capabilities": "kept", "seccomp": [], "limits": {}, "pid_max": None, "errors": []}
    # die with the controller: a killed `ksearch` must not leave a kernel running (with namespaces, this
    # process's death then takes the namespace's init, and so everything in it, along)
    parent = os.getppid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the controller died before the line above took effect
        os._exit(1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not policy:
        return report
    if _namespaces(policy, report):
        devnull = os.open(os.devnull, os.O_RDWR)  # now: P1 is about to make /dev nodev
        init = os.fork()
        if init:
            _wait_and_mirror(init, devnull)  # never returns
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            file_system(policy, report)
        except OSError as e:
            report["errors"].append(f"file system: {e}")
        worker = os.fork()
        if worker:
            _prctl(PR_SET_DUMPABLE, 0)
            _be_init(worker, devnull)  # never returns
        os.close(devnull)
    elif os.geteuid() == 0:
        report["errors"].append("running as root without namespaces: writes anywhere are possible")
    _lock_down(policy, report)
    return report


def launch(args: list[str]) -> int:
    """The compile jail's launcher (`ksearch.jail.compile_jail.LAUNCHER`): ``args`` are ``'<policy JSON>'
    <report fd> -- <exe> <argv0> <args...>``. Enters the jail, writes the report (JSON) to the descriptor and
    execs ``exe`` with ``argv0 args...``. This module and `jail_fs` import only the standard library, all of
    it before the new root hides the interpreter. Returns 127 (after a line on stderr) when the exec fails."""
    import json

    if len(args) < 5 or args[2] != "--":
        print("usage: python -m ksearch.jail.jail '<policy JSON>' <report fd> -- <exe> <argv0> [args...]",
              file=sys.stderr)
        return 2
    policy, report_fd, exe, argv = json.loads(args[0]), int(args[1]), args[3], args[4:]
    report = enter(policy)
    with os.fdopen(report_fd, "w") as f:
        f.write(json.dumps(report))
    try:
        os.execv(exe, argv)
    except OSError as e:
        print(f"compile jail: cannot run {exe}: {e}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
