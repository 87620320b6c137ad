"""Secrets never reach a log record, an exception message, Dagster's run log or psql's argv.

Each failure is forced for real: webhook URLs carrying a secret (Slack path, Teams ``sig=``, Discord token,
a generic ``?token=`` and a secret path) pointed at a closed port on 127.0.0.1 (connection refused) and at a
local HTTP server answering 500 with the path echoed in the body. Every log record at DEBUG (ours, requests'
and urllib3's), the text of every raised exception with its chain, and every event of a Dagster run are
searched for the secret. Plus the ``redact`` table, the logging filter and ``install()``, and psql's argv.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import traceback

import dagster as dg
import pytest
from werkzeug import Request, Response

from rag_pipeline import redact as r
from rag_pipeline.defs.ingestion.resources import NotifierResource
from rag_pipeline.notify import (
    NotificationError,
    SlackNotifier,
    TeamsNotifier,
    WebhookNotifier,
)
from rag_pipeline.store.embedded import psql_invocation

SLACK_SECRET = "xS3cretSlackTok3nQ9"
SIG_SECRET = "TeamsSigS3cretValue77"
DISCORD_SECRET = "d1scordT0kenS3cretZZ"
TOKEN_SECRET = "genericT0kenS3cret42"
PATH_SECRET = "pathS3cretTopic0981"
DB_PASSWORD = "dbPassw0rdS3cret"
ALL_SECRETS = (SLACK_SECRET, SIG_SECRET, DISCORD_SECRET, TOKEN_SECRET, PATH_SECRET, DB_PASSWORD)

PATHS = {
    "slack": f"/services/T0TEST0001/B0TEST0002/{SLACK_SECRET}",
    "teams": "/workflows/0a1b2c3d/triggers/manual/paths/invoke?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual"
             f"%2Frun&sv=1.0&sig={SIG_SECRET}",
    "discord": f"/api/webhooks/1234567890/{DISCORD_SECRET}",
    "token": f"/hook?channel=ops&token={TOKEN_SECRET}",
    "path": f"/alerts/{PATH_SECRET}",
}
NOTIFIERS = {"slack": SlackNotifier, "teams": TeamsNotifier, "discord": WebhookNotifier, "token": WebhookNotifier,
             "path": WebhookNotifier}
SECRET_OF = {"slack": SLACK_SECRET, "teams": SIG_SECRET, "discord": DISCORD_SECRET, "token": TOKEN_SECRET,
             "path": PATH_SECRET}


@pytest.fixture(autouse=True)
def _clean_state():
    """Each test starts without registered secrets or an installed filter; afterwards the process is as
    before (re-installed if something had installed the redaction before this test)."""
    was_installed = r.installed()
    r.uninstall()
    r.forget_secrets()
    yield
    r.uninstall()
    r.forget_secrets()
    if was_installed:
        r.install()


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def echo_500(httpserver):
    """Every request gets a 500 whose body repeats the request's path and query (as some servers do)."""
    def handler(request: Request) -> Response:
        return Response(f"internal error handling {request.full_path}", status=500)

    httpserver.expect_request(re.compile("^/")).respond_with_handler(handler)
    return httpserver


def record_texts(records: list[logging.LogRecord]) -> list[str]:
    """Everything a handler could write for each record: message, raw msg and args, exception and stack
    text (formatted the way a ``logging.Formatter`` would)."""
    fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
    out = []
    for rec in records:
        out += [rec.getMessage(), str(rec.msg), repr(rec.args), fmt.format(rec), rec.exc_text or "",
                rec.stack_info or ""]
    return out


def exception_chain_text(exc: BaseException) -> str:
    """The exception as a traceback prints it: type, message, and every __cause__/__context__."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + repr(exc)


def assert_absent(secret: str, texts) -> None:
    for text in texts:
        assert secret not in text, f"secret {secret!r} leaked in: {text[:500]}"


# --- redact: the table ---------------------------------------------------------------------------------------

REDACT_TABLE = [
    # URL userinfo
    ("postgresql://rag:s3cr3tpw@postgres:5432/rag", "postgresql://rag:***@postgres:5432/rag"),
    ("postgresql://rag:p%40ss@db/rag?sslmode=require", "postgresql://rag:***@db/rag?sslmode=require"),
    ("postgresql://u:p@ss/w@host/db", "postgresql://u:***@host/db"),  # unencoded @ and / in the password
    ("connect to postgresql://rag@db/rag failed", "connect to postgresql://rag@db/rag failed"),  # no password
    ("https://user:tok@api.example.com/x", "https://user:***@api.example.com/x"),
    # query / form parameters named like secrets
    ("https://example.com/cb?code=OAUTHCODE&state=xyz", "https://example.com/cb?code=***&state=xyz"),
    ("https://a.example/x?sig=abc&sv=1.0&signature=def", "https://a.example/x?sig=***&sv=1.0&signature=***"),
    ("https://a.example/x?access_token=AT&api_key=K&key=K2&page=2",
     "https://a.example/x?access_token=***&api_key=***&key=***&page=2"),
    ("https://a.example/x?password=pw&secret=s&token=t", "https://a.example/x?password=***&secret=***&token=***"),
    ("grant_type=refresh_token&client_secret=CS123&refresh_token=RT9",
     "grant_type=refresh_token&client_secret=***&refresh_token=***"),
    ("partition key=docs|a.pdf stays readable", "partition key=docs|a.pdf stays readable"),
    # chat webhooks: scheme + host stay, the path goes
    ("https://hooks.slack.com/services/T0001/B0001/XXXXSECRET", "https://hooks.slack.com/***"),
    ("see https://hooks.slack.com/services/T0001/B0001/XXXXSECRET).", "see https://hooks.slack.com/***)."),
    (("https://prod-01.westeurope.logic.azure.com:443/workflows/abc/triggers/manual/paths/invoke"
      "?api-version=2016-06-01&sp=%2Ftriggers&sv=1.0&sig=SIGSECRET"), "https://prod-01.westeurope.logic.azure.com:443/***"),
    (("https://default0a.12.environment.api.powerplatform.com:443/powerautomate/automations/direct/workflows/ab/"
      "triggers/manual/paths/invoke?api-version=1&sig=SIGSECRET"),
     "https://default0a.12.environment.api.powerplatform.com:443/***"),
    ("https://contoso.webhook.office.com/webhookb2/aaa@bbb/IncomingWebhook/ccc/ddd",
     "https://contoso.webhook.office.com/***"),
    ("https://discord.com/api/webhooks/123/TOKENX", "https://discord.com/***"),
    # the same paths without their host (requests: "Max retries exceeded with url: <path>")
    (("HTTPSConnectionPool(host='hooks.slack.com', port=443): Max retries exceeded with url: "
      "/services/T0AB12CD/B0XY/abcSECRET (Caused by X)"),
     "HTTPSConnectionPool(host='hooks.slack.com', port=443): Max retries exceeded with url: /services/*** (Caused by X)"),
    ('http://127.0.0.1:4567 "POST /services/T0AB12CD/B0XY/abcSECRET HTTP/1.1" 500 5',
     'http://127.0.0.1:4567 "POST /services/*** HTTP/1.1" 500 5'),
    ("url: /api/webhooks/123/TOKENX (Caused", "url: /api/webhooks/*** (Caused"),
    ("url: /workflows/abc/triggers/manual/paths/invoke?api-version=1&sig=SIGSECRET (",
     "url: /workflows/abc/triggers/manual/paths/invoke?api-version=1&sig=*** ("),
    # libpq conninfo
    ("host=/tmp/x dbname=rag user=rag password=pw123456 port=5432", "host=/tmp/x dbname=rag user=rag password=*** port=5432"),
    ("host=/tmp/x password='a b\\' c' dbname=rag", "host=/tmp/x password=*** dbname=rag"),
    ("sslpassword=keypass host=db", "sslpassword=*** host=db"),
    # headers and JSON bodies (OAuth errors)
    ("Authorization: Bearer ya29.a0AfH6SMB", "Authorization: Bearer ***"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("headers={'Authorization': 'Bearer ya29.TOKEN', 'Zotero-API-Key': 'ZKEY123'}",
     "headers={'Authorization': '***', 'Zotero-API-Key': '***'}"),
    ("sent Bearer eyJhbGciOi.J9x", "sent Bearer ***"),
    ('{"error": "invalid_grant", "access_token": "AT123", "refresh_token":"RT", "client_secret": "CS"}',
     '{"error": "invalid_grant", "access_token": "***", "refresh_token":"***", "client_secret": "***"}'),
    ('{"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}',
     '{"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}'),
    # nothing to hide
    ("[Errno 111] Connection refused", "[Errno 111] Connection refused"),
    ("https://example.com/docs/page.html", "https://example.com/docs/page.html"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "expected"), REDACT_TABLE)
def test_redact_table(text, expected):
    assert r.redact(text) == expected
    assert r.redact(expected) == expected  # idempotent: a message redacted twice (source + filter) is unchanged


def test_registered_secrets_are_replaced_wherever_they_appear():
    assert not r.register_secret("")
    assert not r.register_secret("short")  # would blank ordinary words; the patterns still cover URLs
    assert r.register_secret("Zk3yValue/99+x")
    assert r.redact("key Zk3yValue/99+x, encoded Zk3yValue%2F99%2Bx") == "key ***, encoded ***"
    r.register_url(f"https://ntfy.example/{PATH_SECRET}?x=1")
    # requests prints the path without the host; the whole URL is a secret too
    assert r.redact(f"url: /{PATH_SECRET}?x=1 (Caused") == "url: *** (Caused"
    assert r.redact(f"to https://ntfy.example/{PATH_SECRET}?x=1") == "to ***"
    r.forget_secrets()
    assert PATH_SECRET in r.redact(f"url: /{PATH_SECRET}")


def test_env_secrets_are_registered():
    env = {"RAG_SLACK_WEBHOOK_URL": f"https://hooks.example/{PATH_SECRET}",
           "RAG_DATABASE_URL": f"postgresql://rag:{DB_PASSWORD}@db:5432/rag",
           "ZOTERO_API_KEY": "ZoteroKey0123456789", "RAG_MS_CLIENT_SECRET": "MsCl1entS3cret~value"}
    r.register_env_secrets(env)
    text = (f"key ZoteroKey0123456789 secret MsCl1entS3cret~value pw {DB_PASSWORD} path /{PATH_SECRET} "
            "db postgresql://rag@db:5432/rag")
    assert r.redact(text) == "key *** secret *** pw *** path *** db postgresql://rag@db:5432/rag"
    r.forget_secrets()
    r.register_env_secrets({"RAG_DATABASE_URL": f"host=/tmp dbname=rag password='{DB_PASSWORD}'"})
    assert r.redact(f"auth with {DB_PASSWORD}") == "auth with ***"


def test_url_host():
    assert r.url_host(f"https://hooks.slack.com{PATHS['slack']}") == "hooks.slack.com"
    assert r.url_host("http://127.0.0.1:8080/x?sig=1") == "127.0.0.1:8080"


# --- the logging filter and install() ------------------------------------------------------------------------


def test_filter_redacts_message_args_and_exception_text():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("rag_pipeline_tests.secrets.filter")
    handler = Keep()
    handler.addFilter(r.RedactingFilter())
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.error("connecting to %s", f"postgresql://rag:{DB_PASSWORD}@db/rag")
        try:
            raise RuntimeError(f"POST https://hooks.slack.com{PATHS['slack']} failed")
        except RuntimeError:
            logger.exception("alert failed")
        logger.warning("nothing secret here: %d documents", 3)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert_absent(DB_PASSWORD, record_texts(records))
    assert_absent(SLACK_SECRET, record_texts(records))
    assert records[0].getMessage() == "connecting to postgresql://rag:***@db/rag"
    assert "RuntimeError: POST https://hooks.slack.com/*** failed" in records[1].exc_text
    assert records[2].args == (3,)  # a clean record keeps its lazy arguments


def test_install_is_idempotent_and_covers_child_loggers_and_later_handlers(caplog):
    r.install(environ={})
    r.install(environ={})
    assert r.installed()
    assert sum(isinstance(f, r.RedactingFilter) for f in logging.getLogger("rag_pipeline").filters) == 1
    for h in logging.getLogger().handlers:
        assert sum(isinstance(f, r.RedactingFilter) for f in h.filters) == 1
    late: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            late.append(record)

    handler = Keep()  # added after install(): the record factory still redacts
    child = logging.getLogger("rag_pipeline.some.child")
    child.addHandler(handler)
    try:
        with caplog.at_level(logging.DEBUG):
            child.debug("token %s", f"https://x.example/a?token={TOKEN_SECRET}")
            logging.getLogger("urllib3.connectionpool").debug('%s://%s:%s "%s %s %s" %s %s', "http", "127.0.0.1",
                                                              80, "POST", PATHS["slack"], "HTTP/1.1", 500, 5)
    finally:
        child.removeHandler(handler)
    assert_absent(TOKEN_SECRET, record_texts(late) + record_texts(caplog.records) + [caplog.text])
    assert_absent(SLACK_SECRET, record_texts(caplog.records) + [caplog.text])
    r.uninstall()
    assert not r.installed()
    assert not any(isinstance(f, r.RedactingFilter) for f in logging.getLogger("rag_pipeline").filters)


# --- notifiers: failures forced for real ---------------------------------------------------------------------


def _fail_every_kind(base_url: str, caplog) -> list[BaseException]:
    """Build each notifier on ``base_url`` + its secret path, let ``notify`` fail (logged) and ``send`` fail
    (raised); return the raised exceptions."""
    raised = []
    with caplog.at_level(logging.DEBUG):
        for kind, path in PATHS.items():
            notifier = NOTIFIERS[kind](base_url + path, retries=1, backoff_s=0.01, timeout_s=2)
            notifier.notify("permanently_failed", "docs: 1 document(s) became permanently_failed", {"source": "docs"})
            assert (notifier.sent, notifier.failed) == (0, 1)
            with pytest.raises(NotificationError) as info:
                notifier.send("dead_letter", "dead-letter report", {})
            raised.append(info.value)
            assert_absent(SECRET_OF[kind], [repr(notifier), str(vars(notifier).get("host"))])
    return raised


def _assert_notify_records(caplog, base_host: str, *, only_ours: bool) -> None:
    records = [rec for rec in caplog.records if rec.name.startswith("rag_pipeline")] if only_ours else caplog.records
    errors = [rec for rec in records if rec.name == "rag_pipeline.notify" and rec.levelno == logging.ERROR]
    assert len(errors) == len(PATHS)  # one logged failure per notifier: the failure really happened
    for rec in errors:
        assert f"(webhook host {base_host})" in rec.getMessage()
    for secret in SECRET_OF.values():
        assert_absent(secret, record_texts(records) + ([caplog.text] if not only_ours else []))


def test_unreachable_webhooks_never_log_or_raise_their_secret(caplog, closed_port):
    base = f"http://127.0.0.1:{closed_port}"
    raised = _fail_every_kind(base, caplog)
    # redaction at the source: our own records and exceptions are clean without any filter installed
    _assert_notify_records(caplog, f"127.0.0.1:{closed_port}", only_ours=True)
    assert all("ConnectionError" in str(e) for e in raised)
    for secret in SECRET_OF.values():
        assert_absent(secret, [exception_chain_text(e) for e in raised])


def test_server_errors_with_echoed_paths_never_log_or_raise_their_secret(caplog, echo_500):
    base = echo_500.url_for("").rstrip("/")
    raised = _fail_every_kind(base, caplog)
    assert len(echo_500.log) == 2 * 2 * len(PATHS)  # notify and send, each with one retry: they reached it
    assert any(SLACK_SECRET in req.full_path for req, _ in echo_500.log)  # the secret was really sent
    _assert_notify_records(caplog, f"{echo_500.host}:{echo_500.port}", only_ours=True)
    assert all("HTTP 500: internal error handling" in str(e) for e in raised)
    for secret in SECRET_OF.values():
        assert_absent(secret, [exception_chain_text(e) for e in raised])


@pytest.mark.parametrize("mode", ["closed", "500"])
def test_with_install_every_record_is_clean_including_urllib3_debug(caplog, closed_port, httpserver, mode):
    r.install(environ={})
    if mode == "500":
        httpserver.expect_request(re.compile("^/")).respond_with_data("boom", status=500)
        base, host = httpserver.url_for("").rstrip("/"), f"{httpserver.host}:{httpserver.port}"
    else:
        base, host = f"http://127.0.0.1:{closed_port}", f"127.0.0.1:{closed_port}"
    _fail_every_kind(base, caplog)
    if mode == "500":  # urllib3 logged the request line (with the path) at DEBUG, and it was redacted
        assert any(rec.name.startswith("urllib3") and "POST" in rec.getMessage() for rec in caplog.records)
    _assert_notify_records(caplog, host, only_ours=False)


def test_a_bad_url_is_refused_without_echoing_it():
    with pytest.raises(ValueError, match="must start with http") as info:
        SlackNotifier(f"hooks.slack.com{PATHS['slack']}")
    assert_absent(SLACK_SECRET, [exception_chain_text(info.value)])


# --- Dagster run logs ---------------------------------------------------------------------------------------


@dg.asset
def alert_probe(notifier: NotifierResource) -> None:
    """Sends one alert that cannot be delivered (logged), then one with ``send`` (raises: the step fails)."""
    notifier.get().notify("permanently_failed", "probe", {"source": "docs"})
    (first,) = notifier.get().notifiers
    first.send("dead_letter", "probe", {})


def test_dagster_run_logs_hold_no_secret(closed_port):
    r.install(environ={})
    url = f"http://127.0.0.1:{closed_port}{PATHS['slack']}"
    levels = {name: logging.getLogger(name).level for name in ("rag_pipeline", "urllib3")}
    overrides = {"python_logs": {"managed_python_loggers": ["rag_pipeline", "urllib3"], "python_log_level": "DEBUG"}}
    try:
        with dg.instance_for_test(overrides=overrides) as instance:
            result = dg.materialize([alert_probe], instance=instance, raise_on_error=False,
                                    resources={"notifier": NotifierResource(slack_webhook_url=url, retries=0,
                                                                            timeout_s=2)})
            assert not result.success  # send() raised inside the step
            entries = instance.all_logs(result.run_id)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    texts = [repr(e) for e in entries] + [dg.serialize_value(e) for e in entries]
    messages = [e.user_message or "" for e in entries]
    # the failure is in the run log (our logged error and the step failure), without the secret
    assert any("slack alert 'permanently_failed' not delivered" in m for m in messages)
    failures = [e for e in entries if e.dagster_event is not None and e.dagster_event.is_step_failure]
    assert failures and "not delivered" in failures[0].dagster_event.step_failure_data.error.to_string()
    assert_absent(SLACK_SECRET, texts)


# --- psql: the password in the environment, never in argv -----------------------------------------------------

PSQL_TABLE = [
    (f"postgresql://rag:{DB_PASSWORD}@db.example:5432/rag?sslmode=require", DB_PASSWORD,
     "user=rag dbname=rag host=db.example port=5432 sslmode=require"),
    ("postgresql://rag:p%40ss%3Aw0rd%2F@db/rag", "p@ss:w0rd/", "user=rag dbname=rag host=db"),
    (f"postgresql://rag@db/rag?password={DB_PASSWORD}", DB_PASSWORD, "user=rag dbname=rag host=db"),
    (f"host=/tmp/pg dbname=rag user=rag password='{DB_PASSWORD} x'", f"{DB_PASSWORD} x",
     "host=/tmp/pg dbname=rag user=rag"),
    ("postgresql://postgres:@/postgres?host=/tmp/pg", None, "user=postgres dbname=postgres host=/tmp/pg"),
]


@pytest.mark.parametrize(("url", "password", "conninfo"), PSQL_TABLE)
def test_psql_invocation_keeps_the_password_out_of_argv(url, password, conninfo):
    argv, env = psql_invocation(url, ["-c", "select 1"], psql="/usr/bin/psql", environ={"PATH": "/bin"})
    assert argv[0] == "/usr/bin/psql" and argv[2:] == ["-c", "select 1"]
    assert sorted(argv[1].split()) == sorted(conninfo.split())
    if password:
        assert env["PGPASSWORD"] == password
        assert_absent(password, argv)
        assert_absent(password.split()[0], argv)
    else:
        assert "PGPASSWORD" not in env
    assert env["PATH"] == "/bin"


def test_psql_invocation_keeps_an_inherited_password_and_refuses_garbage():
    _, env = psql_invocation("postgresql://rag@db/rag", psql="psql", environ={"PGPASSWORD": "from-env"})
    assert env["PGPASSWORD"] == "from-env"
    with pytest.raises(ValueError, match="not a PostgreSQL URL") as info:
        psql_invocation(f"postgresql://rag:{DB_PASSWORD}@db/rag?nosuchoption=1", psql="psql")
    assert_absent(DB_PASSWORD, [exception_chain_text(info.value)])


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the psql process's argv from /proc")
def test_rag_pipeline_psql_runs_with_the_password_in_its_environment_only(database_url):
    url = f"{database_url} password={DB_PASSWORD}"  # the test server trusts local users: the password is unused
    env = {**os.environ, "RAG_DATABASE_URL": url, "HF_HUB_OFFLINE": "1"}
    env.pop("PGPASSWORD", None)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "psql", *args], check=False, env=env,
                              capture_output=True, text=True, timeout=120)

    plain = cli("-A", "-t", "-c", "select 1")
    assert plain.returncode == 0 and plain.stdout.strip() == "1", plain.stderr
    # psql's \! runs a shell whose parent is psql: read psql's own argv and its PGPASSWORD
    probe = cli("-A", "-t", "-c", r"\! tr '\0' ' ' < /proc/$PPID/cmdline; echo; echo PGPASSWORD=$PGPASSWORD")
    assert probe.returncode == 0, probe.stderr
    cmdline, password_line = probe.stdout.strip().splitlines()[-2:]
    assert "psql" in cmdline and "dbname=" in cmdline
    assert DB_PASSWORD not in cmdline
    assert password_line == f"PGPASSWORD={DB_PASSWORD}"


def test_secret_resource_fields_name_their_variable_not_the_value(monkeypatch):
    import dagster as dg

    from rag_pipeline.definitions import SECRET_VARIABLES, build_definitions

    values = {"RAG_DATABASE_URL": "postgresql://rag:hunter2-db@db.internal/rag",
              "RAG_SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T000/B000/hunter2-slack",
              "RAG_TEAMS_WEBHOOK_URL": "https://example.logic.azure.com/workflows/x?sig=hunter2-teams",
              "RAG_ALERT_WEBHOOK_URL": "https://alerts.example.com/hook?token=hunter2-alert"}
    assert set(values) == set(SECRET_VARIABLES)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    defs = build_definitions([])
    notifier, store = defs.resources["notifier"], defs.resources["store"]
    assert isinstance(store.database_url, dg.EnvVar) and store.database_url.env_var_name == "RAG_DATABASE_URL"
    for field, name in (("slack_webhook_url", "RAG_SLACK_WEBHOOK_URL"), ("teams_webhook_url", "RAG_TEAMS_WEBHOOK_URL"),
                        ("webhook_url", "RAG_ALERT_WEBHOOK_URL")):
        assert getattr(notifier, field).env_var_name == name
    # what the UI shows: the repository snapshot of the code location (resources and their config)
    repo = defs.get_repository_def()
    from dagster._core.remote_representation.external_data import RepositorySnap

    snap = str(RepositorySnap.from_def(repo))
    assert all(v not in snap for v in values.values()) and "RAG_SLACK_WEBHOOK_URL" in snap
    monkeypatch.delenv("RAG_SLACK_WEBHOOK_URL")
    assert build_definitions([]).resources["notifier"].slack_webhook_url == ""  # unset: the resource's fallback
