"""The file system a jailed process sees (step 2 of `ksearch.jail.jail`): a new root holding only what its
policy names, or the host's tree read-only with the user's home hidden. Runs in the namespace's init (PID 1,
with capabilities over the new mount namespace); standard library only, everything imported up front (the
compile jail's new root holds no interpreter)."""

from __future__ import annotations

import ctypes
import errno
import os

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME = 1024, 2048
#: pivot_root's system call number per machine (glibc has no wrapper)
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

#: device files a kernel may still open (everything else under /dev is nodev)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _unescape(text: str) -> str:
    r"""Undo mountinfo's octal escapes (``\040`` for a space); no codec: after the pivot none can be loaded."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1:i + 4].isdigit():
            out.append(chr(int(text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _mountinfo() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = _unescape(fields[4])
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
            libc.umount2(d.encode(), 2)  # MNT_DETACH: undo the mask rather than break the worker
        finally:
            for fd in fds:
                os.close(fd)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def resolve(path: str, links: dict[str, str]) -> str:
    """The host's real path of ``path``; every symbolic link met on the way is recorded in ``links`` (link
    -> its target), so that the same path can be made to resolve inside a new root. A missing component
    ends the walk (the rest is taken as written). Raises OSError (ELOOP) after 40 links."""
    parts = [p for p in path.split("/") if p]
    cur, hops = "/", 0
    while parts:
        name = parts.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            target = os.readlink(nxt)
        except OSError:  # not a link, or missing
            cur = nxt
            continue
        hops += 1
        if hops > 40:
            raise OSError(errno.ELOOP, f"too many symbolic links in {path}")
        links[nxt] = target
        parts = [p for p in target.split("/") if p] + parts
        if target.startswith("/"):
            cur = "/"
    return cur


def _pivot_root(new_root: str) -> None:
    """Make ``new_root`` (a mount point) the root and detach the old one (pivot_root(".", ".")); where the
    system call number is unknown, move the mount onto / and chroot (the old tree stays mounted beneath,
    out of reach of a process without CAP_SYS_CHROOT, which the worker never has)."""
    os.chdir(new_root)
    nr = _PIVOT_ROOT.get(os.uname().machine)
    if nr is not None and libc.syscall(nr, b".", b".") == 0:
        check(libc.umount2(b".", 2), "detach the old root")  # MNT_DETACH
    else:
        _mount(".", "/", None, MS_MOVE)
        check(libc.chroot(b"."), "chroot")
    os.chdir("/")


def _reduced_view(policy: dict, report: dict) -> None:
    """The file system becomes a new, read-only root that holds only ``readable`` (read-only bind mounts),
    ``writable`` (read-write bind mounts), the ``dev`` device nodes, a fresh /proc and the home (a
    size-limited tmpfs), each at its own path; symbolic links on the way to them are recreated, so that
    every path resolves as on the host. A path that contains one of ``hide`` (the invoking user's homes) or
    is ``/`` is left out and reported. It is assembled on a tmpfs at ``stage`` (an empty directory), then
    pivot_root'ed into. Raises OSError when a step fails before the pivot (the caller falls back)."""
    links: dict[str, str] = {}
    hide = [os.path.realpath(h) for h in policy.get("hide", [])]
    binds: dict[str, bool] = {}  # real path -> writable
    for path, writable in [(p, False) for p in policy.get("readable", [])] + \
                          [(p, True) for p in policy.get("writable", [])]:
        real = resolve(path, links)
        if real == "/" or any(_under(h, real) for h in hide):
            report["errors"].append(f"view: {path} left out (it contains {real if real == '/' else 'a home'})")
            continue
        if os.path.exists(real):
            binds[real] = binds.get(real, False) or writable
    devices = [d for d in policy.get("dev", []) if os.path.exists(d)]
    home = resolve(policy["home"], links)
    stage = os.path.realpath(policy["stage"])
    _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    try:
        bound: list[str] = []
        for real in sorted(binds, key=lambda p: (p.count("/"), p)):  # parents first
            over = max((b for b in bound if _under(real, b)), key=len, default=None)
            if over is not None and binds[over] == binds[real]:
                continue  # already visible, the same way
            if over is None:  # a mount point in the stage (inside a bound tree, the host's own path is one)
                if os.path.isdir(real):
                    os.makedirs(stage + real, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(stage + real), exist_ok=True)
                    open(stage + real, "a").close()
            rec = 0 if _under(stage, real) else MS_REC  # never copy the stage into itself
            _mount(real, stage + real, None, MS_BIND | rec)
            bound.append(real)
        for d in devices:
            os.makedirs(os.path.dirname(stage + d), exist_ok=True)
            open(stage + d, "a").close()
            _mount(d, stage + d, None, MS_BIND)
        os.makedirs(stage + "/proc", exist_ok=True)
        _mount("proc", stage + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        if not any(_under(home, b) for b in bound):
            os.makedirs(stage + home, exist_ok=True)
        _mount("tmpfs", stage + home, "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={int(policy.get('home_bytes', 256 << 20))},mode=700")
        # symbolic links last: nothing may be created through one (an absolute target points at the host)
        links.update({"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
                      "/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2"})
        for link, target in sorted(links.items()):
            if any(_under(link, b) for b in bound) or _under(link, home) or os.path.lexists(stage + link):
                continue
            os.makedirs(os.path.dirname(stage + link), exist_ok=True)
            os.symlink(target, stage + link)
        _pivot_root(stage)
    except OSError:
        libc.umount2(stage.encode(), 2)  # MNT_DETACH: back to the host's tree, for the fallback
        raise
    writable = {r for r, w in binds.items() if w} | {home}
    failed = []
    for point, opts in _mountinfo():
        if point == "/proc" or _under(point, home):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | _kept_flags(opts)
        flags |= (0 if point in writable else MS_RDONLY) | (0 if point in devices else MS_NODEV)
        try:
            _mount(None, point, None, flags)
        except OSError as e:
            failed.append(f"{point}: {e.strerror}")
    report["errors"] += [f"read-only remount {f}" for f in failed]
    report["read_only_fs"] = not failed
    report["view"] = sorted(bound) + devices
    report["writable"] = [home] + sorted(r for r, w in binds.items() if w)
    report["hidden"] = hide


def _kept_flags(opts: set[str]) -> int:
    """Flags a remount must repeat (a user namespace locks them on mounts it inherited)."""
    return ((MS_NOEXEC if "noexec" in opts else 0) | (MS_NOATIME if "noatime" in opts else 0)
            | (MS_NODIRATIME if "nodiratime" in opts else 0))


def file_system(policy: dict, report: dict) -> None:
    """Step 2's mounts (we are PID 1 of the new namespaces, with capabilities over the mount namespace)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing we do here may propagate to the host
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    try:
        write_file("/proc/sys/kernel/pid_max", str(int(policy.get("pid_max", 1024))))
        report["pid_max"] = int(policy.get("pid_max", 1024))
    except OSError as e:  # per-namespace pid_max needs Linux 6.14
        report["errors"].append(f"pid_max: {e}")
    if policy.get("view") == "reduced":
        try:
            _reduced_view(policy, report)
            return
        except OSError as e:
            report["errors"].append(f"reduced view: {e}; the host's file system stays in view, read-only")
    _hide(policy.get("hide", []), policy.get("keep", []), report)
    home = policy["home"]
    _mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(policy.get('home_bytes', 256 << 20))},mode=700")
    writable = [p for p in policy.get("writable", []) if os.path.exists(p)]
    gpu = [d for d in policy.get("devices", []) if os.path.exists(d)]  # Policy(gpu=True): /dev/nvidia*
    for path in writable + [d for d in DEVICES if os.path.exists(d)] + gpu:
        _mount(path, path, None, MS_BIND)
    failed = []
    for point, opts in _mountinfo():
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | _kept_flags(opts)
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
