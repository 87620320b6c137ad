"""Alerts to people: Slack and Microsoft Teams incoming webhooks and a generic JSON webhook.

Every class implements ``rag_pipeline.pipeline.steps.Notifier`` (``notify(event, message, details)``); events are
``permanently_failed`` (a document was given up on), ``deletion_guard`` (deletions were refused) and
``dead_letter`` (the daily report of failed documents).
``notify`` never raises: a webhook that is down must not fail a sync whose data is fine. It retries
transient HTTP failures (connection errors, timeouts, 429, 5xx), logs what it could not deliver at ERROR
and counts deliveries in ``sent``/``failed``. ``send`` is the raising variant.

Configuration (``notifier_from_env``): ``RAG_SLACK_WEBHOOK_URL``, ``RAG_TEAMS_WEBHOOK_URL`` (a Teams
*Workflows* "When a Teams webhook request is received" URL: it takes Adaptive Cards) and
``RAG_ALERT_WEBHOOK_URL`` (any endpoint taking JSON). Several may be set; with none, alerts are logged.

A webhook URL is a secret (Slack's path, Teams' ``sig=``): every URL given to a notifier is registered with
``rag_pipeline.redact``, and every log line and exception message produced here goes through ``redact``.
Messages name the notifier kind and the webhook's host, never its URL.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import requests

from rag_pipeline.redact import redact, register_url, url_host

log = logging.getLogger(__name__)

_MAX_FACTS = 10
_MAX_VALUE = 300


class NotificationError(RuntimeError):
    """A webhook did not accept the alert after the retries (message names the status or error)."""


def _facts(details: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Flatten ``details`` into at most ``_MAX_FACTS`` short (title, value) pairs for chat cards."""
    facts = []
    for key, value in details.items():
        if isinstance(value, (list, tuple)):
            shown = [v.get("source_id", v) if isinstance(v, Mapping) else v for v in value[:5]]
            text = ", ".join(str(v) for v in shown) + (f" (+{len(value) - 5} more)" if len(value) > 5 else "")
        elif isinstance(value, Mapping):
            text = json.dumps(value, default=str)
        else:
            text = str(value)
        facts.append((str(key), text[:_MAX_VALUE]))
    return facts[:_MAX_FACTS]


class WebhookNotifier:
    """POST the alert as JSON to ``url``: ``{"event", "message", "details", "sent_at", "sender"}``.

    ``timeout_s``: per request, seconds. ``retries``: extra attempts after a transient failure, waiting
    ``backoff_s * 2**n`` seconds. ``sent``/``failed``: alerts delivered / given up on.
    """

    kind = "webhook"

    def __init__(self, url: str, *, timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 1.0,
                 session: requests.Session | None = None) -> None:
        register_url(url)  # before anything can print it
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{self.kind} webhook URL must start with http:// or https://, got a value "
                             f"starting {redact(url)[:12]!r}")
        self.url = url
        self.host = url_host(url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.session = session or requests.Session()
        self.sent = 0
        self.failed = 0

    def payload(self, event: str, message: str, details: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON body for one alert."""
        return {"event": event, "message": message, "details": json.loads(json.dumps(details, default=str)),
                "sent_at": datetime.now(timezone.utc).isoformat(), "sender": "rag_pipeline"}

    def send(self, event: str, message: str, details: Mapping[str, Any] | None = None) -> requests.Response:
        """Deliver one alert; raises ``NotificationError`` when the endpoint refuses it or stays unreachable."""
        body = self.payload(event, message, dict(details or {}))
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.session.post(self.url, json=body, timeout=self.timeout_s)
            except requests.RequestException as exc:
                # requests' message carries the URL's path and query (the secret of a Slack or Teams URL)
                last = f"{type(exc).__name__}: {redact(str(exc))}"
                continue
            if response.status_code < 300:
                return response
            last = f"HTTP {response.status_code}: {redact(response.text[:200])}"
            if response.status_code != 429 and response.status_code < 500:
                break  # a client error will not get better by retrying
        # raised outside the ``except``: no __context__ chaining the original (unredacted) exception
        raise NotificationError(f"{self.kind} alert {event!r} not delivered: {last} (webhook host {self.host})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(host={self.host!r})"

    def notify(self, event: str, message: str, details: dict[str, Any]) -> None:
        """``send`` without raising: failures are logged at ERROR and counted in ``failed``."""
        try:
            self.send(event, message, details)
        except NotificationError as exc:
            self.failed += 1
            log.error("%s (alert was: %s)", redact(str(exc)), redact(message))
        else:
            self.sent += 1


class SlackNotifier(WebhookNotifier):
    """A Slack incoming webhook: ``text`` (the fallback) plus a section and a fields block."""

    kind = "slack"

    def payload(self, event: str, message: str, details: Mapping[str, Any]) -> dict[str, Any]:
        """Slack's ``{"text", "blocks"}`` body."""
        blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{event}*: {message}"}}]
        facts = _facts(details)
        if facts:
            blocks.append({"type": "section",
                           "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in facts]})
        return {"text": f"[rag_pipeline] {event}: {message}", "blocks": blocks}


class TeamsNotifier(WebhookNotifier):
    """A Microsoft Teams Workflows webhook: one Adaptive Card (title, message, facts)."""

    kind = "teams"

    def payload(self, event: str, message: str, details: Mapping[str, Any]) -> dict[str, Any]:
        """Teams' ``{"type": "message", "attachments": [Adaptive Card]}`` body."""
        card = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard", "version": "1.4",
            "body": [
                {"type": "TextBlock", "text": f"rag_pipeline: {event}", "weight": "Bolder", "size": "Medium",
                 "wrap": True},
                {"type": "TextBlock", "text": message, "wrap": True},
                {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in _facts(details)]},
            ],
        }
        return {"type": "message", "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}]}


class LogNotifier:
    """Writes alerts to the log at WARNING (the fallback when no webhook is configured)."""

    def __init__(self) -> None:
        self.sent = 0

    def notify(self, event: str, message: str, details: dict[str, Any]) -> None:
        """Log the alert."""
        self.sent += 1
        log.warning("%s", redact(f"alert {event}: {message} {json.dumps(details, default=str)[:1000]}"))


class MultiNotifier:
    """Sends each alert to every notifier in ``notifiers`` (one failing does not stop the others)."""

    def __init__(self, notifiers: Sequence[Any]) -> None:
        self.notifiers = list(notifiers)

    def notify(self, event: str, message: str, details: dict[str, Any]) -> None:
        """Forward the alert to each notifier."""
        for n in self.notifiers:
            n.notify(event, message, details)


def build_notifier(*, slack_webhook_url: str = "", teams_webhook_url: str = "", webhook_url: str = "",
                   timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 1.0) -> MultiNotifier:
    """A ``MultiNotifier`` for the given URLs (empty ones skipped); a ``LogNotifier`` alone when all are empty.
    Raises ``ValueError`` for a URL that is not http(s)."""
    options = {"timeout_s": timeout_s, "retries": retries, "backoff_s": backoff_s}
    notifiers: list[Any] = []
    if slack_webhook_url:
        notifiers.append(SlackNotifier(slack_webhook_url, **options))
    if teams_webhook_url:
        notifiers.append(TeamsNotifier(teams_webhook_url, **options))
    if webhook_url:
        notifiers.append(WebhookNotifier(webhook_url, **options))
    return MultiNotifier(notifiers or [LogNotifier()])


def notifier_from_env(environ: Mapping[str, str] | None = None) -> MultiNotifier:
    """``build_notifier`` from ``RAG_SLACK_WEBHOOK_URL``, ``RAG_TEAMS_WEBHOOK_URL``, ``RAG_ALERT_WEBHOOK_URL``."""
    env = os.environ if environ is None else environ
    return build_notifier(slack_webhook_url=env.get("RAG_SLACK_WEBHOOK_URL", "").strip(),
                          teams_webhook_url=env.get("RAG_TEAMS_WEBHOOK_URL", "").strip(),
                          webhook_url=env.get("RAG_ALERT_WEBHOOK_URL", "").strip())
