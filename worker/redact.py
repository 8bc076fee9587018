"""Which values are secrets, and how they are masked in anything printed or written.

One rule for the launcher (``--dry-run``, ``spec.yaml``, the console) and the
worker (TensorBoard's spec text and hparams), so the two never disagree.
Standard library only: the launcher imports it and stays instant.

A value is masked when:
  * its key (at any depth: ``cluster.env``, ``task.args``, ...) has a name part
    in ``SECRET_PARTS``; parts are split at ``_``, ``-``, ``.`` and camelCase
    boundaries, so ``DB_PASS``, ``apiToken``, ``WANDB_API_KEY`` and
    ``aws-secret`` are secrets and ``PASSAGE`` or ``KEYBOARD`` are not;
  * its key is listed in the spec's ``secrets:`` (exact names, any depth);
  * or, inside any string, it is the password of a URL
    (``postgres://user:pw@db/x`` -> ``postgres://user:****@db/x``, RFC 3986
    userinfo);
  * or, in a list of strings (a command line: ``program.argv``, list values of
    ``task.args``), it is the value of a flag or assignment whose name is a
    secret by the rules above: ``--api-token=X`` -> ``--api-token=****``,
    ``--password Y`` -> ``--password ****``, ``DB_PASS=x`` -> ``DB_PASS=****``
    (``masked_argv``).
"""

import re

MASK = "****"
SECRET_PARTS = frozenset({
    "SECRET", "SECRETS", "TOKEN", "TOKENS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PWD", "PASSPHRASE", "KEY", "KEYS", "APIKEY", "CREDENTIAL", "CREDENTIALS", "CRED",
    "CREDS", "PRIVATE", "AUTH", "AUTHORIZATION", "COOKIE", "SESSION", "SIGNATURE", "DSN", "PAT",
})
_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z]|[^A-Za-z]|$)|[A-Z]?[a-z]+|[0-9]+")
# scheme://user:password@ : the password ends at the last '@' before the host
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^\s]*?)(?=@[^@\s]*$|@[^@\s/]*[/?#\s])")


def name_parts(name: str) -> list:
    """``"dbPassWORD_2"`` -> ``["DB", "PASS", "WORD", "2"]``: the words of a key, upper case."""
    return [p.upper() for p in _PARTS.findall(str(name))]


def is_secret(name: str, explicit=()) -> bool:
    """Whether a value under key ``name`` must never be printed or written in clear.

    Args:
      name: the key (an environment variable, a task argument, any spec key).
      explicit: names the spec lists under ``secrets:``.
    """
    if name in explicit:
        return True
    parts = name_parts(name)
    return any(p in SECRET_PARTS for p in parts)


def mask_text(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``MASK``."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text) if "://" in text else text


def masked(value, explicit=(), name=None):
    """A copy of ``value`` (dicts, lists, tuples, scalars) with every secret masked.

    Args:
      value: the tree to mask.
      explicit: key names the spec lists under ``secrets:``.
      name: the key ``value`` sits under, if any.
    """
    if name is not None and is_secret(name, explicit):
        return MASK
    if isinstance(value, dict):
        return {k: masked(v, explicit, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = masked_argv(value, explicit) if any(isinstance(v, str) for v in value) else value
        return type(value)(masked(v, explicit) for v in items)
    if isinstance(value, str):
        return mask_text(value)
    return value


_ASSIGNMENT = re.compile(r"^(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)$", re.S)
_FLAG = re.compile(r"^--?(?P<name>[A-Za-z][A-Za-z0-9_.-]*)$")


def masked_argv(argv, explicit=()) -> list:
    """A copy of the command line ``argv`` with the value of every secret flag masked.

    ``--name=value``, ``-name=value`` and ``name=value`` items whose name is a secret
    (``is_secret``, dashes stripped) keep the name and lose the value; a secret
    ``--name`` or ``-name`` item masks the item after it, unless that one is a flag
    itself. Items that are not strings are kept as they are.
    """
    out = list(argv)
    for i, item in enumerate(out):
        if not isinstance(item, str):
            continue
        assignment = _ASSIGNMENT.match(item)
        if assignment and is_secret(assignment.group("name").lstrip("-"), explicit):
            out[i] = assignment.group("name") + "=" + MASK
            continue
        flag = _FLAG.match(item)
        if (flag and is_secret(flag.group("name"), explicit) and i + 1 < len(out)
                and isinstance(out[i + 1], str) and not out[i + 1].startswith("-")):
            out[i + 1] = MASK
    return out
