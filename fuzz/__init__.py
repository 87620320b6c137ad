"""Fuzz targets (issue 12, part 5): see ``fuzz/README.md`` and ``python -m fuzz.run --help``."""
