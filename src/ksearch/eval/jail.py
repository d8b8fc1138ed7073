"""Inside the worker, before any candidate code loads: namespaces, a read-only file system, no privileges.

`enter` runs first in ``python -m ksearch.eval.worker``, single-threaded, with the policy the controller gave
on the command line (see `sandbox.Policy`). Linux only; every step that the system refuses is skipped and
reported, never fatal. What it does, in order:

1. ``unshare(2)`` new user, mount, network, PID and IPC namespaces (without the user namespace when that is
   refused and we are root; nothing when both are refused). The process (P0) forks P1, the PID namespace's
   init, and waits for it; P0 dies by the same signal as the worker, so the controller sees the worker's
   own exit status.
2. P1 (PID 1) makes every mount private, mounts a fresh /proc (only the namespace's processes are visible),
   sets the namespace's ``pid_max``, masks the directories to hide (the invoking user's home) with an empty
   tmpfs (re-exposing read-only the interpreter, ksearch and the compile cache when they live there), mounts
   a size-limited tmpfs on the candidate's home directory, then remounts every mount read-only, nosuid,
   nodev, except: that tmpfs and the output files (read-write), and /dev/null, zero, full, random, urandom
   (device access kept). It forks P2 and waits; when P2 exits, P1 exits and the kernel kills whatever is
   left in the namespace (escaped, re-parented or daemonized descendants included).
3. P2 (the worker) drops every capability (bounding set, permitted, effective, inheritable, ambient), sets
   no-new-privileges, installs a seccomp filter (x86-64 only) that refuses new processes (threads are
   allowed), exec, sockets, ptrace and cross-process memory access, namespace and mount calls, module
   loading, reboot, kexec, bpf, perf and keyrings; then sets resource limits (core 0, address space, file
   size, CPU time, process count) and returns its report to the worker loop.

Without the namespaces (step 1 refused) steps 2 is skipped and step 3 runs in P0 itself.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import signal
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 22, 38, 47, 4
SECCOMP_MODE_FILTER = 2

#: device files a kernel may still open (everything else under /dev is nodev)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

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
_AUDIT_ARCH_X86_64 = 0xC000003E

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, arg2, arg3, 0, 0), f"prctl({option})")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# -- step 1: namespaces -----------------------------------------------------------------------------------


def _unshare(with_user: bool) -> None:
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | (CLONE_NEWUSER if with_user else 0)
    _check(_libc.unshare(flags), "unshare")
    if with_user:  # we become root of the new namespace, mapped to the same outside user
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")


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


def _mountinfo() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 etc.
            out.append((point, set(fields[5].split(","))))
    return out


def _hide(dirs: list[str], keep: list[str], report: dict) -> None:
    """Cover each directory with an empty tmpfs; bind the kept paths inside it back, read-only later."""
    for d in dirs:
        d = os.path.realpath(d)
        if not os.path.isdir(d) or d == "/":
            continue
        inside = sorted({os.path.realpath(k) for k in keep
                         if os.path.realpath(k).startswith(d + "/") and os.path.exists(k)})
        if any(os.path.realpath(k) in (d,) or d.startswith(os.path.realpath(k) + "/") for k in keep):
            report["errors"].append(f"hide {d}: a path the worker needs contains it; not hidden")
            continue
        inside = [k for k in inside if not any(k != o and k.startswith(o + "/") for o in inside)]
        fds = [os.open(k, os.O_PATH) for k in inside]
        try:
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            for k, fd in zip(inside, fds):
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(k, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(k), exist_ok=True)
                    open(k, "w").close()
                _mount(f"/proc/self/fd/{fd}", k, None, MS_BIND | MS_REC)
            report["hidden"].append(d)
        except OSError as e:
            report["errors"].append(f"hide {d}: {e}")
            _libc.umount2(d.encode(), 2)  # MNT_DETACH: undo the mask rather than break the worker
        finally:
            for fd in fds:
                os.close(fd)


def _file_system(policy: dict, report: dict) -> None:
    """Step 2's mounts (we are PID 1 of the new namespaces, with capabilities over the mount namespace)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing we do here may propagate to the host
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    try:
        _write("/proc/sys/kernel/pid_max", str(int(policy.get("pid_max", 1024))))
        report["pid_max"] = int(policy.get("pid_max", 1024))
    except OSError as e:  # per-namespace pid_max needs Linux 6.14
        report["errors"].append(f"pid_max: {e}")
    _hide(policy.get("hide", []), policy.get("keep", []), report)
    home = policy["home"]
    _mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(policy.get('home_bytes', 256 << 20))},mode=700")
    writable = [p for p in policy.get("writable", []) if os.path.isfile(p)]
    gpu = [d for d in policy.get("devices", []) if os.path.exists(d)]  # Policy(gpu=True): /dev/nvidia*
    for path in writable + [d for d in DEVICES if os.path.exists(d)] + gpu:
        _mount(path, path, None, MS_BIND)
    failed = []
    for point, opts in _mountinfo():
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | (MS_NOEXEC if "noexec" in opts else 0)
        try:
            _mount(None, point, None, flags)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EACCES) or point in ("/", "/dev/shm", "/tmp"):
                failed.append(f"{point}: {e.strerror}")
    for path in [home] + writable:
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
    for path in DEVICES:
        if os.path.exists(path):
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_RDONLY)
    for path in gpu:  # usable device nodes (no nodev); the driver's /proc/driver/nvidia and /sys stay readable
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID)
    report["devices"] = gpu
    report["errors"] += [f"read-only remount {f}" for f in failed]
    report["read_only_fs"] = not any(f.startswith(("/:", "/dev/shm:", "/tmp:")) for f in failed)
    report["writable"] = [home] + writable


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
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() not in (errno.EINVAL,):
            if not privileged:  # an ordinary user outside any user namespace: nothing to drop
                break
            report["errors"].append(f"capability bounding set: cannot drop {cap}")
            break
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")  # _LINUX_CAPABILITY_VERSION_3
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


def _seccomp_program(own_pid: int) -> bytes | None:
    """The filter as bytes (struct sock_filter[]), or None on an architecture we have no table for.

    Denied calls answer EPERM; clone is allowed only with CLONE_THREAD; clone3 answers ENOSYS so that libc
    falls back to clone; kill and tgkill only aimed at ``own_pid``; x32 calls and other ABIs are refused.
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS, 0x80000000
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog: list[tuple] = [
        (ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH_X86_64), (ret, 0, 0, kill),
        (ld, 0, 0, 0), (jge, "deny", 0, 0x40000000),
        (jeq, "clone", 0, _X86_64_CLONE), (jeq, "nosys", 0, _X86_64_CLONE3),
        (jeq, "self", 0, _X86_64_KILL), (jeq, "self", 0, _X86_64_TGKILL),
    ]
    prog += [(jeq, "deny", 0, nr) for nr in sorted(set(_X86_64_DENY.values()))]
    prog += [
        (ret, 0, 0, allow),
        ("label", "clone"), (ld, 0, 0, 16), (jset, 0, "deny", CLONE_THREAD), (ret, 0, 0, allow),
        ("label", "self"), (ld, 0, 0, 16), (jeq, 0, "deny", own_pid), (ret, 0, 0, allow),
        ("label", "nosys"), (ret, 0, 0, enosys),
        ("label", "deny"), (ret, 0, 0, eperm),
    ]
    return _assemble(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp(report: dict) -> None:
    prog = _seccomp_program(os.getpid())
    if prog is None:
        report["errors"].append(f"seccomp: no system call table for {platform.machine()}")
        return
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.addressof(buf))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp")
    report["seccomp"] = sorted(_X86_64_DENY) + ["clone without CLONE_THREAD", "clone3", "kill/tgkill of others"]


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
            _seccomp(report)
        else:
            report["errors"].append("seccomp: switched off")
    except OSError as e:
        report["errors"].append(str(e))
    _limits(policy, report)
    home = policy.get("home")
    if home:
        os.chdir(home)  # again: a tmpfs may now cover the directory we started in


def enter(policy: dict) -> dict:
    """Sandbox this process as `policy` says; returns (in the worker only) what was enforced.

    The report: ``namespaces`` (list), ``read_only_fs`` (bool), ``writable`` (paths), ``hidden`` (paths),
    ``capabilities``, ``seccomp`` (refused calls), ``limits`` (name -> value), ``pid_max``, ``errors``
    (every step the system refused, in words).
    """
    report: dict = {"namespaces": [], "read_only_fs": False, "writable": [], "hidden": [], "capabilities": "kept",
                    "seccomp": [], "limits": {}, "pid_max": None, "errors": []}
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
            _file_system(policy, report)
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
