"""ssh_config resolved by OpenSSH itself (``ssh -G``), handed to fabric.

paramiko's ``SSHConfig`` is a re-implementation that misses parts of
ssh_config(5): it does not follow ``Include`` (a host defined in an included
file was "cannot resolve" while ``ssh`` reached it), matches ``Host`` patterns
case-sensitively, and knows only some ``Match`` criteria. The OpenSSH client
is where those semantics are defined: ``ssh -G HOST`` prints the options it
would use for HOST after every Include, Match, pattern, token and default,
without connecting. Each host (and each ``ProxyJump`` hop, recursively) is
resolved so (hosts whose names match the same ``Host`` lines two per class:
``resolve_with_openssh``), and the answers become a paramiko ``SSHConfig`` of
one exact ``Host`` block per name, which fabric reads as before.

Printed raw by ``ssh -G`` and expanded at connect time, as OpenSSH does:
``%`` tokens in ``IdentityFile`` (by paramiko); those of ``ProxyCommand``
(``%h``, ``%p``, ``%r``, ``%n``, ``%%``) are expanded here.

Without an ``ssh`` client on this machine, paramiko reads the file itself (the
old way); a file that uses ``Include`` is then refused with what to do.
"""

from __future__ import annotations

import concurrent.futures
import copy
import glob
import os
import re
import shutil
import subprocess
from typing import Iterable

import fabric
import paramiko

from launcher.errors import Problem, SpecError

DEFAULT_PATH = "~/.ssh/config"
SSH_G_TIMEOUT_S = 20.0
# The options fabric, paramiko and podlaunch read (ssh -G prints them all; others are unused).
_SINGLE = ("hostname", "user", "port", "connecttimeout", "userknownhostsfile",
           "globalknownhostsfile", "stricthostkeychecking", "proxyjump", "proxycommand",
           "forwardagent")


def resolve_with_openssh(names: Iterable[str], config_file: str, source: str,
                         ssh: str = "ssh") -> dict:
    """``{name: {option: value or [values]}}`` as ``ssh -G`` prints them, for every name and hop.

    ``ssh -G`` is a process of about 4 ms of CPU (its libraries and OpenSSL's start), most
    of the launcher's cost per host (bench/bench_launch_scale.py). Names that match the
    same ``Host`` lines get the same options but their own name (``host_classes``): of
    such a class, two are asked; when their answers agree but for the name itself, the
    others are derived; otherwise every one is asked.

    Args:
      names: host names as the user wrote them.
      config_file: the ssh_config file (``DEFAULT_PATH``: OpenSSH's own search,
        ~/.ssh/config then /etc/ssh/ssh_config; else ``ssh -F config_file``).
      source: the spec file, for error messages.
      ssh: the OpenSSH client.

    Raises:
      SpecError: OpenSSH refused the config (its message, with file and line).
    """
    patterns = host_patterns(config_file)
    resolved: dict = {}
    todo = list(dict.fromkeys(names))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ask = lambda batch: dict(zip(batch, pool.map(  # noqa: E731
            lambda n: _ssh_g(ssh, n, config_file, source), batch)))
        while todo:
            classes = host_classes(todo, patterns)
            raw = ask([n for members in classes for n in members[:2]])
            rest = []
            for members in classes:
                hostname = len(members) > 2 and _class_hostname(
                    members[0], raw[members[0]], members[1], raw[members[1]])
                for name in members[2:]:
                    if hostname:
                        raw[name] = dict(raw[members[0]], identityfile=list(raw[members[0]]["identityfile"]),
                                         hostname=name.lower() if hostname == _OWN else hostname)
                    else:
                        rest.append(name)
            raw.update(ask(rest))
            resolved.update((name, _expand_tokens(name, raw[name])) for name in todo)
            hops = [_hop_host(hop) for options in resolved.values()
                    for hop in options.get("proxyjump", "none").split(",") if hop != "none"]
            todo = [h for h in dict.fromkeys(hops) if h not in resolved]
    return resolved


_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH


def host_patterns(config_file: str) -> list | None:
    """The patterns of every ``Host`` line in the files ``ssh`` reads, Includes followed.

    ``None`` when a line makes a host's options depend on more than which ``Host`` lines
    match its name, or when this reader cannot follow it: ``Match``, ``CanonicalizeHostname``
    other than ``no``, a quoted ``Host`` or ``Include`` argument, an ``Include`` with
    ``%`` or ``$``, or an unreadable file. Lines inside a ``Host`` block are read whatever
    the block matches (more lines than OpenSSH applies make finer classes, never coarser).
    A quote, ``#`` or ``=`` in a ``Host`` or ``Include`` line is not read either.
    Files and their order: ssh_config(5) ("Include", "FILES").
    """
    home_ssh = os.path.expanduser("~/.ssh")
    if config_file == DEFAULT_PATH:
        files = [(os.path.join(home_ssh, "config"), home_ssh), ("/etc/ssh/ssh_config", "/etc/ssh")]
    else:
        files = [(os.path.expanduser(config_file), home_ssh)]
    found: list = []
    for path, base in files:
        if os.path.exists(path) and not _read_host_lines(path, base, found, 0):
            return None
    return found


def _read_host_lines(path: str, base: str, found: list, depth: int) -> bool:
    if depth > _MAX_INCLUDE_DEPTH or os.path.isdir(path):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        keyword, _, args = line.strip().replace("=", " ", 1).replace("\t", " ").partition(" ")
        keyword, args = keyword.lower(), args.strip()
        if keyword == "match" or (keyword == "canonicalizehostname" and args.lower() != "no"):
            return False
        if keyword in ("host", "include") and any(c in args for c in '"#='):
            return False
        if keyword == "host":
            found.append(args.split())
        elif keyword == "include":
            for pattern in args.split():
                if "%" in pattern or "$" in pattern:
                    return False
                pattern = os.path.join(base, os.path.expanduser(pattern))
                for included in sorted(glob.glob(pattern)):
                    if not _read_host_lines(included, base, found, depth + 1):
                        return False
    return True


def host_classes(names: list, patterns: list | None) -> list:
    """``names`` grouped by the ``Host`` lines their name matches (OpenSSH's rule: some
    pattern matches and no ``!`` pattern does; ``*`` and ``?`` only; the name lowercased,
    as ssh lowercases it); each name its own class where ``patterns`` is None."""
    if patterns is None:
        return [[name] for name in names]
    compiled = [[(p.startswith("!"), _glob_re(p.lstrip("!"))) for p in line] for line in patterns]
    classes: dict = {}
    for name in names:
        if "@" in name:  # ssh reads a user from it: asked alone
            classes[(name,)] = [name]
            continue
        lowered = name.lower()
        key = tuple(i for i, line in enumerate(compiled)
                    if any(r.fullmatch(lowered) for neg, r in line if not neg)
                    and not any(r.fullmatch(lowered) for neg, r in line if neg))
        classes.setdefault(key, []).append(name)
    return list(classes.values())


def _glob_re(pattern: str) -> re.Pattern:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                              for c in pattern.lower()), re.DOTALL)


_OWN = "each its own name"


def _class_hostname(a: str, options_a: dict, b: str, options_b: dict) -> str | None:
    """The ``hostname`` of every name in the class of ``a`` and ``b``, given their answers:
    ``_OWN`` (each name, lowercased as ssh prints it) or one literal; ``None`` when the
    answers differ in another option (one that carries the name: ``%h`` in
    UserKnownHostsFile, say), and then each name of the class is asked."""
    rest_a = {k: v for k, v in options_a.items() if k != "hostname"}
    rest_b = {k: v for k, v in options_b.items() if k != "hostname"}
    host_a, host_b = options_a.get("hostname"), options_b.get("hostname")
    if rest_a != rest_b or a.lower() == b.lower():
        return None
    if host_a == host_b:
        return host_a
    return _OWN if (host_a, host_b) == (a.lower(), b.lower()) else None


def _hop_host(hop: str) -> str:
    """The host of a ``ProxyJump`` hop (``[user@]host[:port]``), as fabric parses it."""
    return fabric.connection.derive_shorthand(hop)["host"]


def _ssh_g(ssh: str, name: str, config_file: str, source: str) -> dict:
    argv = [ssh] + ([] if config_file == DEFAULT_PATH else ["-F", os.path.expanduser(config_file)])
    done = subprocess.run(argv + ["-G", name], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=SSH_G_TIMEOUT_S)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if "Pseudo-terminal" not in line]
        raise SpecError([Problem(source, None, "cluster.ssh_config_file",
                                 f"OpenSSH cannot use it for host {name!r}: "
                                 f"{' '.join(said[:2]) or f'ssh -G exited {done.returncode}'}; "
                                 f"fix the file (`ssh -G {name}` shows what ssh makes of it)")])
    options: dict = {"identityfile": []}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "identityfile":
            options["identityfile"].append(value)
        elif key in _SINGLE:
            options[key] = value
    return options


def _expand_tokens(name: str, options: dict) -> dict:
    """``options`` with ``ProxyCommand``'s tokens expanded for ``name``."""
    if options.get("proxycommand", "none") == "none":
        return options
    # fabric expands ProxyCommand's tokens against a config of its own that
    # has no Port (%p became 22): expanded here, as ssh_config(5) TOKENS says.
    tokens = {"%": "%", "h": options.get("hostname", name), "p": options.get("port", "22"),
              "r": options.get("user", ""), "n": name}
    return dict(options, proxycommand=re.sub(r"%(.)", lambda m: tokens.get(m.group(1), m.group(0)),
                                             options["proxycommand"]))


class ExactConfig(paramiko.SSHConfig):
    """A ``paramiko.SSHConfig`` of one exact ``Host`` block per resolved name, looked up by
    name: paramiko's own lookup tries every block's pattern, so the lookups of N hosts
    walked N x N blocks (bench/bench_launch_scale.py)."""

    def __init__(self, per_name: dict):
        super().__init__()
        self._per_name = per_name  # name -> SSHConfig of its one block
        self._answers: dict = {}   # name -> its lookup's answer
        # every block, as paramiko keeps them: fabric's Config.clone copies these alone
        self._config = [block for config in per_name.values() for block in config._config]

    def lookup(self, hostname):
        # each name's answer computed once (the launcher and fabric's Connection both ask);
        # a copy each time, as paramiko gives
        config = self._per_name.get(hostname)
        if config is None:
            return super().lookup(hostname)
        if hostname not in self._answers:
            self._answers[hostname] = config.lookup(hostname)
        return paramiko.SSHConfigDict(copy.deepcopy(dict(self._answers[hostname])))

    def get_hostnames(self):
        return set(self._per_name)


def as_paramiko(resolved: dict) -> paramiko.SSHConfig:
    """One ``Host`` block per resolved name, exact, for fabric's ``Config(ssh_config=...)``.

    ``none`` values (OpenSSH's "unset") are left out, so fabric's defaults apply.
    """
    per_name = {}
    for name, options in resolved.items():
        lines = [f"Host {name}"]
        for key, value in options.items():
            for one in (value if isinstance(value, list) else [value]):
                if one and one != "none" and not (key == "forwardagent" and one == "no"):
                    lines.append(f"    {key} {one}")
        per_name[name] = paramiko.SSHConfig.from_text("\n".join(lines) + "\n")
    return ExactConfig(per_name)


_INCLUDE_RE = re.compile(r"^\s*include[\s=]", re.IGNORECASE | re.MULTILINE)


def fabric_config(names: Iterable[str], config_file: str, source: str) -> fabric.Config:
    """fabric's Config for these hosts: resolved by ``ssh -G`` where an ``ssh`` client is installed.

    Raises:
      SpecError: a ``config_file`` other than the default is missing; OpenSSH
        refused the file; or, without ``ssh``, the file uses ``Include``.
    """
    path = os.path.abspath(os.path.expanduser(config_file))
    if config_file != DEFAULT_PATH and not os.path.exists(path):
        raise SpecError([Problem(source, None, "cluster.ssh_config_file",
                                 f"no such file: {path}; fix the path or remove the key")])
    ssh = shutil.which("ssh")
    if ssh is not None:
        return fabric.Config(ssh_config=as_paramiko(resolve_with_openssh(names, config_file, source, ssh)))
    if not os.path.exists(path):
        return fabric.Config()  # fabric still reads /etc/ssh/ssh_config
    with open(path, encoding="utf-8", errors="replace") as f:
        if _INCLUDE_RE.search(f.read()):
            raise SpecError([Problem(source, None, "cluster.ssh_config_file",
                                     f"{path} uses Include, which only the OpenSSH client follows and "
                                     f"there is no `ssh` on PATH here; install it (openssh-client) "
                                     f"or put the included hosts in the file itself")])
    return fabric.Config(runtime_ssh_path=path)
