"""Secrets out of log lines and error messages.

``redact(text)`` removes from free text:

* the password of a URL's userinfo (``postgresql://rag:pw@host`` -> ``postgresql://rag:***@host``);
* the value of query (and form) parameters named like a secret (``sig``, ``signature``, ``token``, ``key``,
  ``secret``, ``password``, ``code``, ``access_token``, ``api_key``, ``client_secret``, ... -> ``sig=***``);
* the path of a chat webhook URL (Slack ``hooks.slack.com``, Teams ``*.webhook.office.com`` / Workflows
  ``*.logic.azure.com`` / ``*.powerplatform.com``, Discord ``/api/webhooks/``): scheme and host stay, the rest
  becomes ``/***``; the same paths on their own (requests says ``Max retries exceeded with url: /services/...``
  without the host) become ``/services/***`` etc.;
* libpq ``password=...`` (and ``sslpassword=``), JSON/dict ``"access_token": "..."``-style pairs;
* ``Authorization: Bearer ...`` (any scheme), a lone ``Bearer <token>``, ``Zotero-API-Key:``/``X-API-Key:``;
* every value given to ``register_secret`` (and its percent-encoded form), e.g. the webhook URLs, the
  password of ``RAG_DATABASE_URL``, ``ZOTERO_API_KEY``, ``RAG_MS_CLIENT_SECRET``: ``register_env_secrets``
  registers those from the environment. Values shorter than ``MIN_SECRET_LENGTH`` are not registered (they
  would blank ordinary words); the patterns above still catch them in URLs and ``password=``.

``RedactingFilter`` applies ``redact`` to a ``logging.LogRecord`` (the formatted message, the exception text,
the stack text). ``install()`` puts it where records pass:

* on every handler of the root logger (records of all loggers that propagate, e.g. urllib3's DEBUG lines
  that carry request paths) and on the ``rag_pipeline`` logger;
* by default also into the log record factory, so a record is redacted when it is created, whatever
  handler gets it later: Dagster's run-log handler (added to its managed loggers at run start), pytest's
  ``caplog``, a handler added after ``install()``. A filter on a *logger* only sees records logged on that
  exact logger, not on its children (``rag_pipeline.notify``), which is why the factory is the part that
  makes "every record" true.

``install()`` is idempotent; ``uninstall()`` undoes it (for tests). Code that builds a message from something
that may hold a secret should still call ``redact`` itself: the filter is the safety net, not the source.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping

__all__ = ["MASK", "MIN_SECRET_LENGTH", "SECRET_ENV", "WEBHOOK_URL_ENV", "RedactingFilter", "forget_secrets",
           "install", "installed", "redact", "register_env_secrets", "register_secret", "register_url",
           "uninstall", "url_host"]

MASK = "***"
MIN_SECRET_LENGTH = 6

#: Environment variables whose whole value is a secret.
SECRET_ENV = ("ZOTERO_API_KEY", "RAG_MS_CLIENT_SECRET", "RAG_EMBEDDING_API_KEY", "PGPASSWORD", "DAGSTER_PG_PASSWORD")
#: Environment variables holding a URL whose path/query/password are secrets.
WEBHOOK_URL_ENV = ("RAG_SLACK_WEBHOOK_URL", "RAG_TEAMS_WEBHOOK_URL", "RAG_ALERT_WEBHOOK_URL")
#: Environment variables holding a database URL or conninfo (only the password is secret).
DATABASE_URL_ENV = ("RAG_DATABASE_URL",)

# --- patterns -----------------------------------------------------------------------------------------------

_SECRET_PARAM_EXACT = frozenset({
    "sig", "signature", "token", "key", "secret", "password", "passwd", "pwd", "pass", "code", "auth",
    "apikey", "api-key", "access_token", "refresh_token", "id_token", "client_secret", "api_key",
    "private_key", "sas", "credential", "credentials", "session", "sessionid", "jwt", "assertion",
    "client_assertion", "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature",
    "x-goog-credential",
})
_SECRET_PARAM_SUFFIX = ("token", "secret", "password", "passwd", "signature", "_key", "-key", "apikey", "_sig")


def _secret_param(name: str) -> bool:
    n = urllib.parse.unquote(name).lower()
    return n in _SECRET_PARAM_EXACT or n.endswith(_SECRET_PARAM_SUFFIX)


# scheme://[userinfo@]host[:port][path][?query][#fragment], up to whitespace or a quote/bracket.
_URL = re.compile(r"""(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<userinfo>[^\s:/?#@'"<>]*:[^\s'"<>]*@)?"""
                  r"""(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s/?#:'"<>\]\[)]*)(?P<port>:\d*)?(?P<rest>[^\s'"<>]*)""")
# Query/form parameters: at the start or after ? & or ; (not after a space: "partition key=docs" stays readable).
_PARAM = re.compile(r"(?P<lead>^|[?&;])(?P<name>[A-Za-z0-9_.\-\[\]%]+)=(?P<value>[^&#;\s'\"<>]*)")
_WEBHOOK_HOST = re.compile(
    r"(?:^|\.)(?:hooks\.slack\.com|webhook\.office\.com|outlook\.office(?:365)?\.com|logic\.azure\.com"
    r"|powerplatform\.com|powerautomate\.com|discord(?:app)?\.com|chat\.googleapis\.com)$", re.IGNORECASE)
# Webhook paths on their own (requests: "Max retries exceeded with url: /services/T../B../...").
_WEBHOOK_PATHS = [
    (re.compile(r"/(services|workflows|triggers)/T[A-Z0-9]{4,}/[^\s'\"<>)]+"), r"/\1/" + MASK),   # Slack
    (re.compile(r"/(webhookb2|webhook|IncomingWebhook)/[^\s'\"<>)]+", re.IGNORECASE), r"/\1/" + MASK),     # Teams (legacy)
    (re.compile(r"/api/webhooks/\d+/[^\s'\"<>)]+"), "/api/webhooks/" + MASK),                     # Discord
]
# libpq conninfo (and any "password = value"): quoted or bare value.
_CONNINFO_PASSWORD = re.compile(r"(?P<key>(?<![\w-])(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^\s'\"&;,)]+)",
                                re.IGNORECASE)
# JSON / Python-repr pairs: "access_token": "…", 'password': '…'.
_QUOTED_PAIR = re.compile(
    r"""(?P<key>(?P<kq>["'])(?P<name>[A-Za-z0-9_\-]+)(?P=kq)\s*:\s*)(?P<vq>["'])(?P<value>(?:(?!(?P=vq))[^\\]|\\.)*)(?P=vq)""")
_AUTH_HEADER = re.compile(
    r"""(?P<key>\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?)(?P<scheme>(?:bearer|basic|token|bot|sso-key|"""
    r"""digest|negotiate|ntlm)\s+)?(?P<value>[^\s'",}\]]+)""", re.IGNORECASE)
_BEARER = re.compile(r"\b(?P<scheme>Bearer)\s+(?P<value>(?!\*\*\*)[A-Za-z0-9\-._~+/]+=*)", re.IGNORECASE)
_KEY_HEADER = re.compile(
    r"""(?P<key>\b(?:zotero-api-key|x-api-key|api-key|x-auth-token|x-functions-key|ocp-apim-subscription-key)"""
    r"""["']?\s*[:=]\s*["']?)(?P<value>[^\s'",}\]]+)""", re.IGNORECASE)


def _redact_query(query: str) -> str:
    return _PARAM.sub(lambda m: f"{m['lead']}{m['name']}={MASK}" if _secret_param(m["name"]) and m["value"] != MASK
                      else m[0], query)


def _redact_url(m: re.Match[str]) -> str:
    scheme, userinfo, host, port, rest = m["scheme"], m["userinfo"] or "", m["host"], m["port"] or "", m["rest"]
    if userinfo:
        userinfo = userinfo.partition(":")[0] + f":{MASK}@"  # user:password@ (a bare user@ is no secret)
    if _WEBHOOK_HOST.search(host):
        trail = re.search(r"[.,;:)\]}]*$", rest)[0]  # prose punctuation after the URL stays
        if rest[:len(rest) - len(trail)] not in ("", "/"):
            rest = "/" + MASK + trail
    return f"{scheme}://{userinfo}{host}{port}{rest}"


def _redact_quoted_pair(m: re.Match[str]) -> str:
    if not _secret_param(m["name"]) and m["name"].lower() not in ("authorization", "sig"):
        return m[0]
    return f"{m['key']}{m['vq']}{MASK}{m['vq']}"


# --- registered secrets -------------------------------------------------------------------------------------

_lock = threading.Lock()
_secrets: set[str] = set()
_secret_re: re.Pattern[str] | None = None


def register_secret(value: str | None) -> bool:
    """Remember ``value`` as a secret: ``redact`` replaces it (and its percent-encoded forms) with ``***``.
    Returns False (and registers nothing) for an empty value or one shorter than ``MIN_SECRET_LENGTH``."""
    global _secret_re
    if not value:
        return False
    value = str(value).strip()
    if len(value) < MIN_SECRET_LENGTH:
        return False
    forms = {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value, safe="")}
    with _lock:
        if forms <= _secrets:
            return True
        _secrets.update(forms)
        _secret_re = None
    return True


def register_url(url: str | None) -> None:
    """Register the secret parts of a URL: the URL itself, its password, its path-and-query (requests
    prints the path without the host) and the values of its secret-named query parameters."""
    if not url:
        return
    url = url.strip()
    register_secret(url)
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return
    register_secret(password)
    if parts.path not in ("", "/") or parts.query:
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        register_secret(tail)
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=False):
        if _secret_param(name):
            register_secret(value)


def register_database_url(url: str | None) -> None:
    """Register the password of a database URL or libpq conninfo (the rest of it is not secret)."""
    if not url:
        return
    url = url.strip()
    if "://" in url:
        try:
            register_secret(urllib.parse.unquote(urllib.parse.urlsplit(url).password or ""))
        except ValueError:
            pass
        for name, value in urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query):
            if name.lower() in ("password", "sslpassword"):
                register_secret(value)
    for m in _CONNINFO_PASSWORD.finditer(url):
        value = m["value"]
        if value.startswith("'") and value.endswith("'") and len(value) >= 2:
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        register_secret(value)


def register_env_secrets(environ: Mapping[str, str] | None = None) -> None:
    """Register the secrets this project reads from the environment (``WEBHOOK_URL_ENV``,
    ``DATABASE_URL_ENV``, ``SECRET_ENV``)."""
    env = os.environ if environ is None else environ
    for name in WEBHOOK_URL_ENV:
        register_url(env.get(name, ""))
    for name in DATABASE_URL_ENV:
        register_database_url(env.get(name, ""))
    for name in SECRET_ENV:
        register_secret(env.get(name, ""))


def forget_secrets() -> None:
    """Forget every registered secret (for tests)."""
    global _secret_re
    with _lock:
        _secrets.clear()
        _secret_re = None


def _registered() -> re.Pattern[str] | None:
    global _secret_re
    with _lock:
        if _secret_re is None and _secrets:
            alternatives = sorted(_secrets, key=len, reverse=True)  # longest first: a URL before its path
            _secret_re = re.compile("|".join(re.escape(s) for s in alternatives))
        return _secret_re


# --- redact -------------------------------------------------------------------------------------------------


def redact(text: str) -> str:
    """``text`` with secrets replaced by ``***`` (see the module docstring for what counts)."""
    if not isinstance(text, str):
        text = str(text)
    if not text:
        return text
    registered = _registered()
    if registered is not None:
        text = registered.sub(MASK, text)
    text = _URL.sub(_redact_url, text)
    for pattern, replacement in _WEBHOOK_PATHS:
        text = pattern.sub(replacement, text)
    text = _redact_query(text)
    text = _CONNINFO_PASSWORD.sub(lambda m: m["key"] + MASK, text)
    text = _QUOTED_PAIR.sub(_redact_quoted_pair, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m['key']}{m['scheme'] or ''}{MASK}", text)
    text = _BEARER.sub(lambda m: f"{m['scheme']} {MASK}", text)
    text = _KEY_HEADER.sub(lambda m: m["key"] + MASK, text)
    return text


def url_host(url: str) -> str:
    """The host (and port) of ``url`` only, for log lines that must say where something went."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        return f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        return "?"


# --- logging ------------------------------------------------------------------------------------------------

_formatter = logging.Formatter()


class RedactingFilter(logging.Filter):
    """Redacts a record in place: the formatted message (``msg % args``), the exception text and the stack
    text. A record without a secret is left untouched (``msg``/``args`` keep their lazy formatting); one
    with a secret gets ``msg`` = the redacted message, ``args`` = ``()``, and, when its exception text
    held a secret, ``exc_text`` = the redacted traceback and ``exc_info`` = ``None`` (so no handler
    formats the original again). Never rejects a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Apply ``redact`` to ``record`` in place (see ``RedactingFilter``); returns it."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001  (a broken format string: leave it for logging to report)
        message = None
    if message is not None:
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[0] is not None:
        text = record.exc_text or _formatter.formatException(record.exc_info)
        clean = redact(text)
        if clean != text:
            record.exc_text, record.exc_info = clean, None
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    return record


_FILTER = RedactingFilter()
_state: dict[str, object] = {}


def _attach(filterers: Iterable[logging.Filterer]) -> None:
    for f in filterers:
        if not any(isinstance(x, RedactingFilter) for x in f.filters):
            f.addFilter(_FILTER)


def install(*, record_factory: bool = True, environ: Mapping[str, str] | None = None) -> None:
    """Register the environment's secrets (``register_env_secrets``) and add ``RedactingFilter`` to the
    root logger's handlers and the ``rag_pipeline`` logger; with ``record_factory`` (the default) also wrap
    the log record factory so every record is redacted when created. Idempotent: calling it again attaches
    the filter to handlers added since, and never wraps the factory twice."""
    register_env_secrets(environ)
    _attach(logging.getLogger().handlers)
    _attach([logging.getLogger("rag_pipeline")])
    if record_factory and "factory" not in _state:
        previous = logging.getLogRecordFactory()

        def factory(*args, **kwargs) -> logging.LogRecord:
            return redact_record(previous(*args, **kwargs))

        factory.__redacting__ = True  # type: ignore[attr-defined]
        _state["previous_factory"], _state["factory"] = previous, factory
        logging.setLogRecordFactory(factory)


def installed() -> bool:
    """Whether the record factory of ``install()`` is in place."""
    return bool(getattr(logging.getLogRecordFactory(), "__redacting__", False))


def uninstall() -> None:
    """Undo ``install()``: remove the filter from every logger and handler it may be on, restore the record
    factory (when nobody wrapped it since). Registered secrets stay (``forget_secrets`` clears them)."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for lg in loggers:
        for f in [lg, *lg.handlers]:
            for x in [x for x in f.filters if isinstance(x, RedactingFilter)]:
                f.removeFilter(x)
    factory = _state.pop("factory", None)
    previous = _state.pop("previous_factory", None)
    if factory is not None and logging.getLogRecordFactory() is factory:
        logging.setLogRecordFactory(previous)  # type: ignore[arg-type]
