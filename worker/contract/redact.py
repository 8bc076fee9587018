"""Which values are secrets, and how they are masked in anything printed or written.

One rule for the launcher (``--dry-run``, ``spec.yaml``, the console) and the
worker (TensorBoard's spec text and hparams), so the two never disagree.
Standard library only: the launcher imports it and stays instant.

A value is masked when:
  * its key (at any depth: ``cluster.env``, ``task.args``, ...) has a name part
    in ``SECRET_PARTS``; parts are split at ``_``, ``-``, ``.`` and camelCase
    boundaries, so ``DB_PASS``, ``apiToken``, ``WANDB_API_KEY`` and
    ``aws-secret`` are secrets and ``PASSAGE`` or ``KEYBOARD`` are not; a part
    written without separators is a secret when it holds an unambiguous secret
    word (``GLUED``: ``DBPASSWORD``, ``AUTHTOKEN``, ``SECRETKEY``, ``SESSIONID``)
    or ends in ``PASS``/``PWD`` (``DBPASS``; not ``BYPASS`` or ``COMPASS``);
  * its key is listed in the spec's ``secrets:`` (exact names, any depth);
  * or, inside any string, it is the password of a URL
    (``postgres://user:pw@db/x`` -> ``postgres://user:****@db/x``, RFC 3986
    userinfo; ``user:pw@host`` without a scheme too), or the value of a secret
    keyword in a connection string, query or command line (``password=pw dbname=x``,
    ``Server=x;Pwd=pw;``, ``?token=t&y=1``, ``curl --token=t``: the keyword is a secret by the rules
    above), or an HTTP credential (``Bearer T``, ``Authorization: Basic B``);
  * or, in a list of strings (a command line: ``program.argv``, list values of
    ``task.args``), it is the value of a flag or assignment whose name is a
    secret by the rules above: ``--api-token=X`` -> ``--api-token=****``,
    ``--password Y`` -> ``--password ****``, ``DB_PASS=x`` -> ``DB_PASS=****``
    (``masked_argv``); an assignment's value written as a YAML or JSON flow mapping has its
    secret keys' values masked: ``cluster.env={HF_TOKEN: x}`` ->
    ``cluster.env={HF_TOKEN: ****}`` (``launch --set``).
"""

import re

MASK = "****"
SECRET_PARTS = frozenset({
    "SECRET", "SECRETS", "TOKEN", "TOKENS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PWD", "PASSPHRASE", "KEY", "KEYS", "APIKEY", "CREDENTIAL", "CREDENTIALS", "CRED",
    "CREDS", "PRIVATE", "AUTH", "AUTHORIZATION", "COOKIE", "SESSION", "SIGNATURE", "DSN", "PAT",
    "WEBHOOK",  # a webhook's URL is its credential (notify.webhook, SLACK_WEBHOOK_URL)
})
_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z]|[^A-Za-z]|$)|[A-Z]?[a-z]+|[0-9]+")
# secret words inside a part written without separators; TOKEN not in TOKENIZER
GLUED = re.compile(r"SECRET|TOKEN(?!IZ)|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|APIKEY|ACCESSKEY|"
                   r"PRIVATEKEY|SIGNINGKEY|MASTERKEY|AUTHKEY|SESSION|COOKIE|AUTHORIZATION")
_GLUED_END = re.compile(r".+(?:PASS|PWD)$")
NOT_GLUED = frozenset({"BYPASS", "COMPASS", "SURPASS", "TRESPASS", "OVERPASS", "UNDERPASS"})
# user:password@host without a scheme (a proxy setting, an scp-like address)
_BARE_PASSWORD = re.compile(r"(?P<head>(?<![\w/:@.-])[A-Za-z_][A-Za-z0-9_.+-]*:)(?P<pw>[^\s:@/]+)(?=@[A-Za-z0-9.-]+)")
# an HTTP credential: "Bearer T" anywhere, any scheme after "Authorization:" (curl -H, a header env)
_HTTP_AUTH = re.compile(r"(?P<head>\bBearer\s+|\bAuthorization:\s*[A-Za-z-]+\s+)(?P<pw>[^\s'\"]+)",
                        re.IGNORECASE)
# name=value in a connection string or a query, --name=value in a command line written as one
# string (a notify command's shell script): the value ends at whitespace, ; & or ,
_KEYWORD = re.compile(r"(?P<head>(?:^|(?<=[\s;&?,]))-{0,2}(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*)"
                      r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s;&,]+)")
# scheme://user:password@ : the password ends at the last '@' before the host
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^\s]*?)(?=@[^@\s]*$|@[^@\s/]*[/?#\s])")


def name_parts(name: str) -> list:
    """``"dbPassWORD_2"`` -> ``["DB", "PASS", "WORD", "2"]``: the words of a key, upper case."""
    return [p.upper() for p in _PARTS.findall(str(name))]


def is_secret(name: str, explicit=()) -> bool:
    """Whether a value under key ``name`` must never be printed or written in clear.

    Args:
      name: the key (an environment variable, a task argument, any spec key), or a dotted
        path to it (``cluster.env.TEAM``: its last part is the key).
      explicit: names the spec lists under ``secrets:`` (a dotted entry,
        ``cluster.env.TEAM``, names its last part).
    """
    last = str(name).rsplit(".", 1)[-1]  # --set's dotted keys; a dotted entry of secrets:
    if name in explicit or last in explicit or any(str(e).rsplit(".", 1)[-1] == last
                                                   for e in explicit):
        return True
    return any(p in SECRET_PARTS or (p not in NOT_GLUED and (GLUED.search(p) or _GLUED_END.match(p)))
               for p in name_parts(name))


def mask_text(text: str, explicit=()) -> str:
    """``text`` with every password of a URL (``scheme://user:pw@``, ``user:pw@host``), every
    HTTP credential (``Bearer T``) and every value of a secret keyword (``password=pw``)
    replaced by ``MASK``."""
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    if "@" in text:
        text = _BARE_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _HTTP_AUTH.sub(lambda m: m.group("head") + MASK, text)
    if "=" in text:
        text = _KEYWORD.sub(lambda m: m.group("head") + MASK if is_secret(m.group("name"), explicit)
                            else m.group(0), text)
    return text


def masked(value, explicit=(), name=None):
    """A copy of ``value`` (dicts, lists, tuples, scalars) with every secret masked.

    Args:
      value: the tree to mask.
      explicit: key names the spec lists under ``secrets:``.
      name: the key ``value`` sits under, if any.
    """
    if name is not None and is_secret(name, explicit):
        return MASK
    if isinstance(value, dict):  # a spec's own secrets: list holds key names, shown as they are
        return {k: list(v) if name is None and k == "secrets" and isinstance(v, (list, tuple))
                else masked(v, explicit, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = masked_argv(value, explicit) if any(isinstance(v, str) for v in value) else value
        return type(value)(masked(v, explicit) for v in items)
    if isinstance(value, str):
        return mask_text(value, explicit)
    return value


# a key and its value in a YAML or JSON flow mapping ({HF_TOKEN: x, "db_pass": "y"}): the value
# ends at the next , } or ]
_FLOW_PAIR = re.compile(r"(?P<head>(?:^|(?<=[{,\s]))(?P<quote>[\"']?)(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)"
                        r"(?P=quote)\s*:\s*)(?P<value>'[^']*'|\"[^\"]*\"|[^,{}\[\]\s][^,{}\[\]]*?)"
                        r"(?=\s*[,}\]]|\s*$)")


def mask_flow(text: str, explicit=()) -> str:
    """``text``, a YAML or JSON flow mapping, with the value of every secret key masked
    (``{HF_TOKEN: x, lr: 1}`` -> ``{HF_TOKEN: ****, lr: 1}``), at any depth."""
    return _FLOW_PAIR.sub(lambda m: m.group("head") + MASK if is_secret(m.group("name"), explicit)
                          else m.group(0), text)


_ASSIGNMENT = re.compile(r"^(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)$", re.S)
_FLAG = re.compile(r"^--?(?P<name>[A-Za-z][A-Za-z0-9_.-]*)$")


def masked_argv(argv, explicit=()) -> list:
    """A copy of the command line ``argv`` with the value of every secret flag masked.

    ``--name=value``, ``-name=value`` and ``name=value`` items whose name is a secret
    (``is_secret``, dashes stripped) keep the name and lose the value; a secret
    ``--name`` or ``-name`` item masks the item after it, unless that one is a flag
    itself. Any other string item is ``mask_text``'d. Items that are not strings are kept
    as they are.
    """
    out = list(argv)
    for i, item in enumerate(out):
        if not isinstance(item, str):
            continue
        assignment = _ASSIGNMENT.match(item)
        if assignment and is_secret(assignment.group("name").lstrip("-"), explicit):
            out[i] = assignment.group("name") + "=" + MASK
            continue
        if assignment and _ASSIGNMENT.match(assignment.group("value")):  # --set=KEY=VALUE
            out[i] = assignment.group("name") + "=" + masked_argv([assignment.group("value")],
                                                                  explicit)[0]
            continue
        if assignment and ":" in assignment.group("value"):  # {KEY: v} or KEY: v (YAML)
            out[i] = assignment.group("name") + "=" + mask_text(
                mask_flow(assignment.group("value"), explicit), explicit)
            continue
        flag = _FLAG.match(item)
        if (flag and is_secret(flag.group("name"), explicit) and i + 1 < len(out)
                and isinstance(out[i + 1], str) and not out[i + 1].startswith("-")):
            out[i + 1] = MASK
        elif out[i] is item:  # not masked whole: a URL's password or a keyword's value inside
            out[i] = mask_text(item, explicit)
    return out
