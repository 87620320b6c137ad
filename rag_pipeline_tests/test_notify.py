"""Alerts against a local HTTP server (pytest-httpserver): Slack, Teams and generic webhook payloads,
retries, and a webhook that is down never failing the caller."""

from __future__ import annotations

import json
import logging
import socket

import pytest
from werkzeug import Response

from rag_pipeline.notify import (
    LogNotifier,
    MultiNotifier,
    NotificationError,
    SlackNotifier,
    TeamsNotifier,
    WebhookNotifier,
    build_notifier,
    notifier_from_env,
)

DETAILS = {"source": "local:/srv/docs", "documents": [{"source_id": f"doc{n}.pdf", "reason": "timeout"} for n in range(7)]}


def _bodies(httpserver) -> list[dict]:
    return [json.loads(req.get_data()) for req, _ in httpserver.log]


def test_slack_payload_has_fallback_text_and_fields(httpserver):
    httpserver.expect_request("/slack", method="POST").respond_with_data("ok")
    SlackNotifier(httpserver.url_for("/slack")).send("permanently_failed", "2 documents gave up", DETAILS)
    (body,) = _bodies(httpserver)
    assert body["text"] == "[rag_pipeline] permanently_failed: 2 documents gave up"
    assert body["blocks"][0]["text"]["text"] == "*permanently_failed*: 2 documents gave up"
    fields = [f["text"] for f in body["blocks"][1]["fields"]]
    assert fields[0] == "*source*\nlocal:/srv/docs"
    # lists are shortened: five ids shown, the rest counted
    assert fields[1] == "*documents*\ndoc0.pdf, doc1.pdf, doc2.pdf, doc3.pdf, doc4.pdf (+2 more)"


def test_teams_payload_is_one_adaptive_card(httpserver):
    httpserver.expect_request("/teams", method="POST").respond_with_data("", status=202)
    TeamsNotifier(httpserver.url_for("/teams")).send("deletion_guard", "would delete 9 of 10", {"listed": 1})
    (body,) = _bodies(httpserver)
    assert body["type"] == "message"
    (attachment,) = body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    assert [b["type"] for b in card["body"]] == ["TextBlock", "TextBlock", "FactSet"]
    assert card["body"][1]["text"] == "would delete 9 of 10"
    assert card["body"][2]["facts"] == [{"title": "listed", "value": "1"}]


def test_generic_webhook_gets_event_message_and_details(httpserver):
    httpserver.expect_request("/hook", method="POST").respond_with_data("")
    WebhookNotifier(httpserver.url_for("/hook")).send("permanently_failed", "gave up", DETAILS)
    (body,) = _bodies(httpserver)
    assert body["event"] == "permanently_failed" and body["message"] == "gave up"
    assert body["details"] == DETAILS and body["sender"] == "rag_pipeline"
    assert body["sent_at"].endswith("+00:00")


def test_server_error_is_retried_then_delivered(httpserver):
    httpserver.expect_ordered_request("/hook").respond_with_response(Response("busy", status=503))
    httpserver.expect_ordered_request("/hook").respond_with_data("ok")
    notifier = WebhookNotifier(httpserver.url_for("/hook"), retries=2, backoff_s=0.01)
    notifier.notify("deletion_guard", "tripped", {})
    assert len(httpserver.log) == 2
    assert (notifier.sent, notifier.failed) == (1, 0)


def test_client_error_is_not_retried_and_send_raises(httpserver):
    httpserver.expect_request("/hook").respond_with_response(Response("no such hook", status=404))
    notifier = WebhookNotifier(httpserver.url_for("/hook"), retries=3, backoff_s=0.01)
    with pytest.raises(NotificationError, match="HTTP 404: no such hook"):
        notifier.send("deletion_guard", "tripped", {})
    assert len(httpserver.log) == 1


def test_unreachable_webhook_is_logged_not_raised(caplog):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    notifier = SlackNotifier(url, retries=1, backoff_s=0.01, timeout_s=2)
    with caplog.at_level(logging.ERROR, logger="rag_pipeline.notify"):
        notifier.notify("permanently_failed", "gave up", {})
    assert (notifier.sent, notifier.failed) == (0, 1)
    assert "slack alert 'permanently_failed' not delivered: ConnectionError" in caplog.text


def test_multi_notifier_reaches_every_endpoint(httpserver):
    for path in ("/slack", "/teams", "/hook"):
        httpserver.expect_request(path).respond_with_data("ok")
    notifier = build_notifier(slack_webhook_url=httpserver.url_for("/slack"),
                              teams_webhook_url=httpserver.url_for("/teams"), webhook_url=httpserver.url_for("/hook"))
    notifier.notify("permanently_failed", "gave up", {"source": "s"})
    assert sorted(req.path for req, _ in httpserver.log) == ["/hook", "/slack", "/teams"]


def test_env_configuration_and_log_fallback(httpserver, caplog):
    env = {"RAG_TEAMS_WEBHOOK_URL": httpserver.url_for("/teams"), "RAG_SLACK_WEBHOOK_URL": " "}
    (only,) = notifier_from_env(env).notifiers
    assert isinstance(only, TeamsNotifier)
    (fallback,) = notifier_from_env({}).notifiers
    assert isinstance(fallback, LogNotifier)
    with caplog.at_level(logging.WARNING, logger="rag_pipeline.notify"):
        MultiNotifier([fallback]).notify("deletion_guard", "tripped", {"listed": 0})
    assert 'alert deletion_guard: tripped {"listed": 0}' in caplog.text


@pytest.mark.parametrize("url", ["ftp://example.com/hook", "hooks.slack.com/x", ""])
def test_bad_url_is_refused_at_configuration(url):
    # a typo in a webhook URL is an error when the notifier is built, not a silent lost alert later
    with pytest.raises(ValueError, match="must start with http"):
        WebhookNotifier(url)
