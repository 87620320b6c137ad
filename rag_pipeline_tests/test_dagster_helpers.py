"""Shared helpers for the Dagster tests (no tests here): resources pointed at the test database, an
instance with the ``documents`` partitions, small folders of real text files, and runs of the assets.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from rag_pipeline.defs.documents.assets import document_chunks, document_embeddings, document_markdown
from rag_pipeline.defs.documents.partitions import document_partition_key, documents
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.defs.sources.config import SourceSpec, spec_from_dict
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import generations as gens
from rag_pipeline.store import write as w

DOCUMENT_ASSETS = [document_markdown, document_chunks, document_embeddings]

TEXTS = {
    "bees.md": "# Bees\n\nHoney bees tell each other where flowers are with a waggle dance.\n",
    "tides.txt": "Tides are caused by the gravitational pull of the moon on the oceans.\n",
    "volcano.md": "# Volcanoes\n\nMagma rises through cracks in the crust and erupts as lava.\n",
    "glaciers.txt": "Glaciers are rivers of ice that carve valleys as they slowly move downhill.\n",
    "comets.md": "# Comets\n\nA comet's tail always points away from the sun, pushed by the solar wind.\n",
}


def write_folder(folder: Path, names: list[str] | None = None) -> Path:
    """Write the named ``TEXTS`` (all by default) into ``folder``; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names or list(TEXTS):
        (folder / name).write_text(TEXTS[name], encoding="utf-8")
    return folder


def spec_for(folder: Path, name: str = "docs", **extra) -> SourceSpec:
    """A local source spec named ``name`` over ``folder``."""
    return spec_from_dict({"name": name, "kind": "local", "path": str(folder), **extra})


def resources_for(database_url: str, specs: list[SourceSpec], *, webhook_url: str = "") -> dict[str, object]:
    """Resources pointing at the test database; alerts to ``webhook_url`` (no retries) or the log."""
    return {
        "rag_settings": SettingsResource(overrides=json.dumps({"database_url": database_url})),
        "store": StoreResource(database_url=database_url),
        "embedder": EmbedderResource(),
        "sources": SourcesResource(sources_json=json.dumps({s.name: s.source.model_dump() for s in specs})),
        "notifier": NotifierResource(webhook_url=webhook_url, retries=0, timeout_s=5),
    }


def keys_for(spec: SourceSpec, names) -> list[str]:
    """Partition keys of documents ``names`` of ``spec``."""
    return [document_partition_key(spec.name, n) for n in names]


def materialize_document(instance: dg.DagsterInstance, resources, key: str, *, assets=None,
                         run_config=None, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """One per-document run (as the sensor requests them) of ``assets`` (default: all three)."""
    if key not in instance.get_dynamic_partitions(documents.name):
        instance.add_dynamic_partitions(documents.name, [key])
    return dg.materialize(assets or DOCUMENT_ASSETS, partition_key=key, resources=resources, instance=instance,
                          run_config=run_config, raise_on_error=raise_on_error)


def materialize_batch(instance: dg.DagsterInstance, resources, keys: list[str], *, assets=None,
                      raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """A ranged run over ``keys`` (added in this order), as a backfill batch runs."""
    existing = instance.get_dynamic_partitions(documents.name)
    instance.add_dynamic_partitions(documents.name, [k for k in keys if k not in existing])
    return dg.materialize(assets or DOCUMENT_ASSETS, resources=resources, instance=instance,
                          tags={"dagster/asset_partition_range_start": keys[0],
                                "dagster/asset_partition_range_end": keys[-1]},
                          raise_on_error=raise_on_error)


def check_results(result: dg.ExecuteInProcessResult, name: str) -> dict[str | None, dg.AssetCheckEvaluation]:
    """The evaluations of check ``name`` in ``result``, by partition."""
    return {e.partition: e for e in result.get_asset_check_evaluations() if e.check_name == name}


def metadata_of(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, dict[str, object]]:
    """``{partition: {metadata key: value}}`` of ``asset``'s materializations in ``result``."""
    return {m.partition: {k: v.value for k, v in m.metadata.items()}
            for m in result.asset_materializations_for_node(asset)}


@pytest.fixture
def instance():
    """A throwaway Dagster instance (SQLite in a temp dir)."""
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture
def folder(tmp_path) -> Path:
    """A folder holding the five small ``TEXTS``."""
    return write_folder(tmp_path / "docs")


def copy_corpus(shared_dir: Path, dest: Path, names: list[str]) -> Path:
    """Copy files from ``../shared/corpus`` into ``dest`` (tests never write into ../shared)."""
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copy(shared_dir / "corpus" / n, dest / n)
    return dest


def index_folder(store, folder: Path, names=None, *, dimension: int = 384) -> dict[str, int]:
    """Write the folder's documents into the index as completed (the real swap transaction, with
    placeholder vectors: the sensor never reads vectors). Returns ``{source_id: document id}``."""
    source = LocalFolderSource(folder)
    ids = {}
    rng = np.random.default_rng(0)
    with store.connection() as conn:
        active = gens.active(conn).id
        for doc in source.list_documents(verify=True).documents:  # with hashes: what the swap records
            if names is not None and doc.source_id not in names:
                continue
            text = (folder / doc.source_id).read_text()
            document_id = w.ensure_document(conn, source.name, doc)
            vector = rng.normal(size=dimension).astype(np.float32)
            w.replace_document(conn, document_id, doc=doc, content_sha256=doc.content_sha256,
                               chunks=[w.ChunkRow(0, text, 20, {active: vector / np.linalg.norm(vector)})],
                               mime_type="text/plain", doc_type="txt",
                               char_count=len(text), page_count=None, stats={}, markdown=text, expires=None)
            ids[doc.source_id] = document_id
    return ids
