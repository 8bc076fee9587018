# long: shipped by source to every host and inlined alone (launcher.remote.source): all the process control hosts share
"""Process control shared by the launcher and the programs it ships to hosts.

One definition of: the stop sequence (TERM and CONT, wait, KILL, wait), dying
with the parent (PR_SET_PDEATHSIG), the port check that JAX's coordinator
would pass, and the ``/proc`` readers (process state, process group members,
environment, open files). Used by the
local backend, supervision, ``launch tensorboard`` and, shipped by source
(``launcher.remote.source``), by the programs that run on SSH and TPU hosts.

Rules for this module, because it runs on hosts as well: standard library
only, no ``from __future__`` import, no annotations newer than Python 3.8
accepts at run time, no import of anything from ``launcher``.

Linux ``/proc`` layout: proc(5), ``/proc/PID/stat`` fields after the
parenthesised command: state (3rd field of the line), ppid, pgrp.
"""

import errno
import os
import signal
import socket
import time

POLL_S = 0.05
# How long a KILL is given to take effect (a JAX process under load takes a moment to exit):
# the stop sequence's last wait, and a failed start's before it says it stopped the workers.
KILL_WAIT_S = 5.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


# ---- /proc -----------------------------------------------------------------------
def pids():
    """Every pid in ``/proc`` now (ints, unsorted)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def stat_fields(pid):
    """``(state, ppid, pgrp)`` of ``pid`` from ``/proc/PID/stat``, or None if it is gone.

    state is one letter as bytes (b"R", b"S", b"T", b"Z", ...).
    """
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def start_ticks(pid):
    """When ``pid`` started (clock ticks since boot, ``/proc/PID/stat``), or None if it is gone:
    with the pid, it names one process even after the pid is reused."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_process(pid, since):
    """Whether ``pid`` is still the process a journal names: this user's, started at clock tick
    ``since`` (``start_ticks``; a pid reused since is another process), and not a zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[0] == b"Z" or since is None:
        return False
    try:
        mine = os.stat("/proc/%d" % pid).st_uid == os.getuid()
    except OSError:
        return False
    return mine and start_ticks(pid) == since


def state(pid):
    """The process state letter of ``pid`` as a str ("R", "S", "T", "Z", ...), or None if gone."""
    fields = stat_fields(pid)
    return None if fields is None else fields[0].decode("ascii", "replace")


def is_stopped(pid):
    """Whether ``pid`` is stopped (state T: SIGSTOP or job control; t: a tracer)."""
    return state(pid) in ("T", "t")


def environ(pid):
    """The environment of ``pid`` as a list of ``b"NAME=value"`` items ([] when unreadable)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def cmdline(pid, limit=120):
    """The command line of ``pid``, arguments joined by spaces, cut to ``limit`` characters."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:limit]
    except OSError:
        return "?"


def group_members(pgid, env_item=None):
    """Live (non-zombie) pids in process group ``pgid``.

    Args:
      pgid: the process group id.
      env_item: if given (bytes ``b"NAME=value"``), only processes whose
        environment holds exactly that item count: pids are reused, a run's
        marker in the environment is not.
    """
    found = []
    for pid in pids():
        fields = stat_fields(pid)
        if fields is None or fields[0] == b"Z" or fields[2] != pgid:
            continue
        if env_item is not None and env_item not in environ(pid):
            continue
        found.append(pid)
    return found


def descendants(root):
    """Live (non-zombie) descendants of ``root`` by the ppid links in ``/proc``, parents first.

    A process whose parent died is reparented (to init, or to the nearest
    ``PR_SET_CHILD_SUBREAPER`` ancestor): run under a subreaper, every process
    a worker ever started stays below it, even one that left the worker's
    process group or session.
    """
    children = {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields is not None and fields[0] != b"Z":
            children.setdefault(fields[1], []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants(root, rounds=20, poll_s=0.02):
    """SIGKILL every descendant of ``root`` (repeated: a dying process may still fork).

    Returns:
      The descendants still alive at the end ([] when all are gone).
    """
    for _ in range(rounds):
        alive = descendants(root)
        if not alive:
            return []
        for pid in alive:
            signal_pid(pid, (signal.SIGKILL,))
        time.sleep(poll_s)
    return descendants(root)


# The signals podlaunch's processes are driven by: stop in order (TERM, INT, HUP, QUIT), the
# stacks and profile requests (USR1, USR2), a frozen process continued (CONT), children's ends
# (CHLD: ignored, the kernel reaps them and ``wait`` fails), a timer (ALRM).
NEEDED_SIGNALS = tuple(getattr(signal, name) for name in (
    "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGCHLD", "SIGALRM"))


def sane_signals(keep_ignored=()):
    """Undo what the process that started this one may have left: ``NEEDED_SIGNALS`` unblocked
    in this thread's mask and each one ignored back to its default (SIGINT to Python's
    ``KeyboardInterrupt``), but those in ``keep_ignored`` (``nohup``'s SIGHUP). A runner that
    blocks or ignores SIGTERM (``trap '' TERM``, a JVM or .NET host) passes both on to every
    child through fork and exec: a preemption's SIGTERM never reached a worker, and ``launch
    stop`` signalled a launcher that could not hear it. Called first by the launcher and by the
    wrapper on each host; every process they start inherits the result.

    Returns:
      The names of the signals that were blocked or ignored (empty: the process was sane).
    """
    fixed = []
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    signal.pthread_sigmask(signal.SIG_UNBLOCK, NEEDED_SIGNALS)
    for sig in NEEDED_SIGNALS:
        if sig in blocked:
            fixed.append(sig.name)
        if sig in keep_ignored or signal.getsignal(sig) is not signal.SIG_IGN:
            continue
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        if sig.name not in fixed:
            fixed.append(sig.name)
    return fixed


def open_files_to_the_hard_limit():
    """The open-files limit (``ulimit -n``) raised to its hard limit, for this process and
    every one it starts (a pipe and a log per worker, JAX's sockets in each): a low soft
    limit (a runner's 20, a login's 1024) ended runs in gloo's "Too many open files" and
    launcher logs that could not be opened, though the hard limit allowed far more. What
    cannot be raised is named where it bites (``worker.contract.causes.exhausted``)."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):  # a hard limit the kernel refuses as a soft one (macOS)
        pass


def set_child_subreaper():
    """Make this process the reaper of its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER).

    Returns:
      Whether it took effect (False elsewhere than Linux).
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def open_files(paths, skip_pid=None):
    """Processes with any of ``paths`` open: ``({pid: set(paths held)}, unreadable count)``.

    ``paths`` must be real paths (``os.path.realpath``). Processes whose fd
    table cannot be read (another user's, without root) are counted, not listed.
    """
    paths = set(paths)
    found, unreadable = {}, 0
    for pid in pids():
        if pid == skip_pid:
            continue
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except PermissionError:
            unreadable += 1
            continue
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target in paths:
                found.setdefault(pid, set()).add(target)
    return found, unreadable


# ---- signals ---------------------------------------------------------------------
def signal_group(pgid, signals):
    """Send each of ``signals`` (ints or names like "TERM") to process group ``pgid``.

    A group that is gone, or not ours to signal, is ignored: teardown goes on.
    """
    for sig in signals:
        if isinstance(sig, str):
            sig = getattr(signal, "SIG" + sig)
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_pid(pid, signals):
    """Send each of ``signals`` (ints or names like "TERM") to ``pid``, ignoring a process
    that is gone."""
    for sig in signals:
        if isinstance(sig, str):
            sig = getattr(signal, "SIG" + sig)
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_until(done, timeout_s, poll_s=POLL_S, clock=time.monotonic, sleep=time.sleep):
    """Poll ``done()`` until it is true or ``timeout_s`` seconds passed; return its last value."""
    deadline = clock() + timeout_s
    while True:
        result = done()
        if result or clock() >= deadline:
            return result
        sleep(poll_s)


def stop(send, alive, grace_s, kill_wait_s=KILL_WAIT_S, clock=time.monotonic, sleep=time.sleep,
         poll_s=POLL_S):
    """The stop sequence: TERM (and CONT, so a stopped process can act on it),
    up to ``grace_s`` seconds, then KILL, then up to ``kill_wait_s`` seconds.

    Args:
      send: called with a tuple of signals, e.g. ``(SIGTERM, SIGCONT)``.
      alive: returns whether anything to stop is still alive.
      grace_s: seconds between TERM and KILL.
      kill_wait_s: seconds to wait for the KILL to take effect.
      clock, sleep, poll_s: how the waits tell and pass time (``wait_until``).

    Returns:
      True when nothing is alive at the end.
    """
    if not alive():
        return True
    send((signal.SIGTERM, signal.SIGCONT))
    if wait_until(lambda: not alive(), grace_s, poll_s, clock, sleep):
        return True
    return kill_and_wait(send, alive, kill_wait_s, clock, sleep, poll_s)


def kill_and_wait(send, alive, kill_wait_s=KILL_WAIT_S, clock=time.monotonic, sleep=time.sleep,
                  poll_s=POLL_S):
    """The end of the stop sequence alone: KILL, then wait up to ``kill_wait_s`` seconds
    (``send`` and ``alive`` as for ``stop``). Returns True when nothing is alive at the end."""
    send((signal.SIGKILL,))
    return bool(wait_until(lambda: not alive(), kill_wait_s, poll_s, clock, sleep))


def stop_group(pgid, grace_s, env_item=None, kill_wait_s=KILL_WAIT_S):
    """``stop`` every process of group ``pgid`` (optionally only those with ``env_item``).

    Returns:
      The pids of the group still alive at the end ([] when it is gone).
    """
    alive = lambda: group_members(pgid, env_item)  # noqa: E731
    stop(lambda sigs: signal_group(pgid, sigs), alive, grace_s, kill_wait_s)
    return alive()


def stop_pids(pid_list, grace_s, alive_pids, kill_wait_s=KILL_WAIT_S):
    """``stop`` the processes ``pid_list``; ``alive_pids()`` says which of them still live.

    Returns:
      The pids still alive at the end.
    """
    def send(sigs):
        for pid in set(pid_list) & set(alive_pids()):
            signal_pid(pid, sigs)
    stop(send, lambda: set(pid_list) & set(alive_pids()), grace_s, kill_wait_s)
    return sorted(set(pid_list) & set(alive_pids()))


def die_with_parent(sig=signal.SIGKILL):
    """In a child before exec: get ``sig`` when the parent dies (Linux PR_SET_PDEATHSIG).

    For ``subprocess.Popen(preexec_fn=die_with_parent)``. Elsewhere than Linux
    it does nothing (teardown still covers every normal path).
    """
    import ctypes  # only here: the programs shipped to hosts rarely need it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# ---- ports -----------------------------------------------------------------------
# JAX's coordinator (gRPC) listens on [::]:PORT, every address of both families, with
# SO_REUSEADDR. A port is checked the same way: on the IPv6 wildcard with IPV6_V6ONLY off
# (which also holds it on every IPv4 address), and on ``host`` over IPv4 where the machine
# has no IPv6.
EPHEMERAL_RANGE_PATH = "/proc/sys/net/ipv4/ip_local_port_range"
_FALLBACK_EPHEMERAL = (32768, 60999)   # Linux's default ip_local_port_range
_CANDIDATE_PORTS = 12000               # how far below the ephemeral range free_port looks


def _try_bind(family, address):
    """bind's error for ``address``, or None: it bound (closed again). socket()'s is raised."""
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(address)
    except OSError as exc:
        return exc
    finally:
        s.close()
    return None


def bind_error(port, host=""):
    """Why JAX's coordinator could not listen on ``port`` now, or None if it could.

    Checked as gRPC binds it: ``[::]:port`` dual-stack with SO_REUSEADDR
    (connections of an earlier run left in TIME_WAIT do not count as in use),
    or ``host:port`` over IPv4 on a machine without IPv6. Only EADDRINUSE is
    "in use"; bind's other errnos (EACCES below 1024) are said by their meaning.

    Raises:
      OSError: no TCP socket can be opened here at all (EAFNOSUPPORT for IPv4 too, or EPERM:
        a sandbox, a seccomp filter, a locked-down host): nothing could listen on any port.
    """
    if socket.has_ipv6:
        try:
            exc = _try_bind(socket.AF_INET6, ("::", port))
            if exc is None or exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                return _bind_words(port, exc)
        except OSError:  # no IPv6 socket (IPv6 off, or refused): IPv4 decides
            pass
    return _bind_words(port, _try_bind(socket.AF_INET, (host, port)))


def _bind_words(port, exc):
    if exc is None or exc.errno == errno.EADDRINUSE:
        return None if exc is None else "port %d is in use (%s)" % (port, exc.strerror)
    return "port %d cannot be bound here (%s, errno %s)" % (port, os.strerror(exc.errno), exc.errno)


def ephemeral_range():
    """``(low, high)`` of the ports the kernel hands to outgoing connections and bind(0)."""
    try:
        with open(EPHEMERAL_RANGE_PATH) as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _FALLBACK_EPHEMERAL


def free_port(host=""):
    """A TCP port that JAX's coordinator could listen on a moment ago.

    Picked at random *below* the kernel's ephemeral range (``ip_local_port_range``),
    not by bind(0): a port bind(0) hands out lies in that range, which every
    outgoing connection on the machine draws its local port from, so in the
    seconds before process 0 binds it another connection can take it and JAX
    fails with "Failed to add port to server". Falls back to bind(0) where no
    port below the range is free.

    Raises:
      OSError: no TCP socket can be opened or bound here (a sandbox: see ``bind_error``).
    """
    import random
    low, _ = ephemeral_range()
    first = max(1024, low - _CANDIDATE_PORTS)
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(first, max(first + 1, low))
        if bind_error(port, host) is None:
            return port
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        return s.getsockname()[1]
    finally:
        s.close()
