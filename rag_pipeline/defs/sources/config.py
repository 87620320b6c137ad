"""Which sources exist: read once, when the definitions load (never at import).

In order of precedence:

1. ``RAG_SOURCES``: a JSON list of objects, e.g.
   ``[{"name": "docs", "kind": "local", "path": "/srv/docs", "interval_s": 60}]``;
2. ``RAG_SOURCES_FILE``: the path of a file holding that list as JSON or YAML;
3. ``RAG_SOURCE_PATH``: one local folder, named ``local`` (``RAG_SOURCE_INCLUDE``/``RAG_SOURCE_EXCLUDE``:
   comma-separated globs);
4. nothing: no sources (the per-document assets, checks and failure sensor still load).

Each object takes the fields of ``SourceResource`` (``kind``, ``path``, ``include``, ``exclude``,
``library``, ``folder``, ``shared_drive``, ``drive``, ``acl_file``, ``held_documents``) plus ``name`` (required: letters, digits, ``_``;
it names the source's assets, sensor and schedule and prefixes its partition keys), ``interval_s``
(seconds between sensor ticks, default 60), ``max_inflight_runs`` (document runs in flight per source,
default 50), ``reconcile_cron`` (the daily full reconciliation, default ``"0 3 * * *"``) and
``permission_interval_s`` (seconds between permission syncs, default 300).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_pipeline.defs.documents.partitions import SOURCE_NAME_RE
from rag_pipeline.defs.ingestion.resources import SourceResource

_SOURCE_FIELDS = set(SourceResource.model_fields)
_SPEC_FIELDS = {"name", "interval_s", "max_inflight_runs", "reconcile_cron", "permission_interval_s"}


@dataclass(frozen=True)
class SourceSpec:
    """One configured source: ``name``, the connector options (``source``), sensor ``interval_s``
    (seconds), ``max_inflight_runs``, the ``reconcile_cron`` of its daily full reconciliation and the
    seconds between permission syncs (``permission_interval_s``, default 300)."""

    name: str
    source: SourceResource
    interval_s: int = 60
    max_inflight_runs: int = 50
    reconcile_cron: str = "0 3 * * *"
    permission_interval_s: int = 300

    @property
    def kind(self) -> str:
        """The connector kind (``local``, ``zotero``, ``gdrive``, ``sharepoint``)."""
        return self.source.kind


def spec_from_dict(data: Mapping[str, Any]) -> SourceSpec:
    """Validate one source object; raises ``ValueError`` naming the problem."""
    unknown = set(data) - _SOURCE_FIELDS - _SPEC_FIELDS
    if unknown:
        raise ValueError(f"unknown source field(s) {sorted(unknown)}; known: {sorted(_SOURCE_FIELDS | _SPEC_FIELDS)}")
    name = str(data.get("name", ""))
    if not SOURCE_NAME_RE.match(name):
        raise ValueError(f"source name {name!r} must match {SOURCE_NAME_RE.pattern}")
    fields = {k: str(v) for k, v in data.items() if k in _SOURCE_FIELDS}
    if fields.get("kind", "local") not in ("local", "zotero", "gdrive", "sharepoint"):
        raise ValueError(f"source {name}: unknown kind {fields['kind']!r}: local, zotero, gdrive or sharepoint")
    if fields.get("kind", "local") == "local" and not fields.get("path"):
        raise ValueError(f"source {name}: a local source needs a path")
    if fields.get("kind", "local") == "local":
        fields["path"] = str(Path(fields["path"]).expanduser().resolve())
    if fields.get("held_documents", "hide") not in ("hide", "keep"):
        raise ValueError(f"source {name}: held_documents must be hide or keep")
    interval = int(data.get("interval_s", 60))
    inflight = int(data.get("max_inflight_runs", 50))
    permission_interval = int(data.get("permission_interval_s", 300))
    if interval < 1 or inflight < 1 or permission_interval < 1:
        raise ValueError(f"source {name}: interval_s, max_inflight_runs and permission_interval_s must be positive")
    return SourceSpec(name, SourceResource(**fields), interval, inflight, str(data.get("reconcile_cron", "0 3 * * *")),
                      permission_interval)


def load_source_specs(environ: Mapping[str, str] | None = None) -> list[SourceSpec]:
    """The configured sources (see module docstring); raises ``ValueError`` for invalid configuration,
    duplicate names included."""
    env = os.environ if environ is None else environ
    raw: Any
    if env.get("RAG_SOURCES", "").strip():
        try:
            raw = json.loads(env["RAG_SOURCES"])
        except json.JSONDecodeError as exc:
            raise ValueError(f"RAG_SOURCES is not valid JSON: {exc}") from exc
    elif env.get("RAG_SOURCES_FILE", "").strip():
        path = Path(env["RAG_SOURCES_FILE"]).expanduser()
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    elif env.get("RAG_SOURCE_PATH", "").strip():
        raw = [{"name": "local", "kind": "local", "path": env["RAG_SOURCE_PATH"],
                "include": env.get("RAG_SOURCE_INCLUDE", ""), "exclude": env.get("RAG_SOURCE_EXCLUDE", "")}]
    else:
        return []
    if not isinstance(raw, list) or not all(isinstance(x, Mapping) for x in raw):
        raise ValueError("the source configuration must be a list of objects")
    specs = [spec_from_dict(x) for x in raw]
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate source name(s): {', '.join(duplicates)}")
    return specs
