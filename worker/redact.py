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
    userinfo).
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
        return type(value)(masked(v, explicit) for v in value)
    if isinstance(value, str):
        return mask_text(value)
    return value
