"""ssh_config resolved by OpenSSH itself (``ssh -G``), handed to fabric.

paramiko's ``SSHConfig`` is a re-implementation that misses parts of
ssh_config(5): it does not follow ``Include`` (a host defined in an included
file was "cannot resolve" while ``ssh`` reached it), matches ``Host`` patterns
case-sensitively, and knows only some ``Match`` criteria. The OpenSSH client
is where those semantics are defined: ``ssh -G HOST`` prints the options it
would use for HOST after every Include, Match, pattern, token and default,
without connecting. Each host (and each ``ProxyJump`` hop, recursively) is
resolved so, and the answers become a paramiko ``SSHConfig`` of one exact
``Host`` block per name, which fabric reads as before.

Printed raw by ``ssh -G`` and expanded at connect time, as OpenSSH does:
``%`` tokens in ``IdentityFile`` (by paramiko); those of ``ProxyCommand``
(``%h``, ``%p``, ``%r``, ``%n``, ``%%``) are expanded here.

Without an ``ssh`` client on this machine, paramiko reads the file itself (the
old way); a file that uses ``Include`` is then refused with what to do.
"""

from __future__ import annotations

import concurrent.futures
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

    Args:
      names: host names as the user wrote them.
      config_file: the ssh_config file (``DEFAULT_PATH``: OpenSSH's own search,
        ~/.ssh/config then /etc/ssh/ssh_config; else ``ssh -F config_file``).
      source: the spec file, for error messages.
      ssh: the OpenSSH client.

    Raises:
      SpecError: OpenSSH refused the config (its message, with file and line).
    """
    resolved: dict = {}
    todo = list(dict.fromkeys(names))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        while todo:
            answers = pool.map(lambda n: _ssh_g(ssh, n, config_file, source), todo)
            resolved.update(zip(todo, answers))
            hops = [_hop_host(hop) for options in resolved.values()
                    for hop in options.get("proxyjump", "none").split(",") if hop != "none"]
            todo = [h for h in dict.fromkeys(hops) if h not in resolved]
    return resolved


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
    if options.get("proxycommand", "none") != "none":
        # fabric expands ProxyCommand's tokens against a config of its own that
        # has no Port (%p became 22): expanded here, as ssh_config(5) TOKENS says.
        tokens = {"%": "%", "h": options.get("hostname", name), "p": options.get("port", "22"),
                  "r": options.get("user", ""), "n": name}
        options["proxycommand"] = re.sub(r"%(.)", lambda m: tokens.get(m.group(1), m.group(0)),
                                         options["proxycommand"])
    return options


class ExactConfig(paramiko.SSHConfig):
    """A ``paramiko.SSHConfig`` of one exact ``Host`` block per resolved name, looked up by
    name: paramiko's own lookup tries every block's pattern, so the lookups of N hosts
    walked N x N blocks (bench/bench_launch_scale.py)."""

    def __init__(self, per_name: dict):
        super().__init__()
        self._per_name = per_name  # name -> SSHConfig of its one block
        # every block, as paramiko keeps them: fabric's Config.clone copies these alone
        self._config = [block for config in per_name.values() for block in config._config]

    def lookup(self, hostname):
        config = self._per_name.get(hostname)
        return config.lookup(hostname) if config is not None else super().lookup(hostname)

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
