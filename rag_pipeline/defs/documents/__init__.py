"""Per-document assets on the ``documents`` partitions: Markdown, chunks, embeddings, their checks."""
