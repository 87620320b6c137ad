"""PDF extraction speed against the floor, in one run.

Floor: the fastest plain text extraction available, pypdfium2 page text (``get_textpage`` +
``get_text_range`` per page, no layout, no clean-up). Ours: ``extract_in_process`` (reading order,
columns, tables, headers/footers, de-hyphenation, font repairs, clean-up, quality record) and, for
DA-619p, ``extract`` through the isolated worker (limits enforced). Figures are pages per second;
the ratio is ours / floor (target: at least 0.25).

Usage: ``python benchmarks/bench_extraction.py [--repeat N] [--with-unstructured]``.
``--with-unstructured`` also times ``unstructured``'s ``partition_pdf(strategy="fast")``
(pdfminer) on the small text PDFs and on 60 pages of DA-619p, for comparison (slow).
Reads ``../shared/corpus`` next to the repository; never run by pytest.
"""

from __future__ import annotations

import argparse
import io
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
BIG = "DA-619p.pdf"
TEXT_PDFS = [
    "layout-parser-paper-fast.pdf",
    "copy-protected.pdf",
    "layout-parser-paper-with-empty-pages.pdf",
    "layout-parser-paper-with-table.pdf",
    "multi-column-2p.pdf",
    "fake-memo.pdf",
    "fake-memo-with-duplicate-page.pdf",
    "korean-text-with-tables.pdf",
    "a1977-backus-p21.pdf",
    "zen_of_python_corrupted.pdf",
]


def floor_pages(data: bytes) -> int:
    """Plain PDFium page text of every page; returns the page count."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(data)
    n = len(pdf)
    for i in range(n):
        page = pdf[i]
        textpage = page.get_textpage()
        textpage.get_text_range()
        textpage.close()
        page.close()
    pdf.close()
    return n


def timed(fn, repeat: int) -> float:
    """Best wall time of ``repeat`` runs of ``fn()``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--with-unstructured", action="store_true")
    args = parser.parse_args()
    if not CORPUS.is_dir():
        print(f"{CORPUS} missing", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from rag_pipeline.config import Settings
    from rag_pipeline.extraction import extract, extract_in_process

    # warm up imports of both paths so neither pays first-import costs in its timing
    warm = (CORPUS / "fake-memo.pdf").read_bytes()
    floor_pages(warm)
    extract_in_process(warm, filename="fake-memo.pdf")

    print(f"{'document':42} {'pages':>5} {'floor p/s':>10} {'ours p/s':>9} {'ratio':>6}")
    rows = []
    big = (CORPUS / BIG).read_bytes()
    n_big = floor_pages(big)
    t_floor = timed(lambda: floor_pages(big), args.repeat)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = None

    def ours_big():
        nonlocal result
        result = extract_in_process(big, filename=BIG)

    t_ours = timed(ours_big, args.repeat)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows.append((BIG, n_big, n_big / t_floor, n_big / t_ours))
    print(f"{BIG:42} {n_big:5d} {n_big / t_floor:10.1f} {n_big / t_ours:9.1f} {t_floor / t_ours:6.2f}")

    total_pages = 0
    t_floor_sum = t_ours_sum = 0.0
    for name in TEXT_PDFS:
        data = (CORPUS / name).read_bytes()
        pages = floor_pages(data)
        tf = timed(lambda: floor_pages(data), max(5, args.repeat))
        to = timed(lambda: extract_in_process(data, filename=name), max(5, args.repeat))
        total_pages += pages
        t_floor_sum += tf
        t_ours_sum += to
        print(f"{name:42} {pages:5d} {pages / tf:10.1f} {pages / to:9.1f} {tf / to:6.2f}")
    print(
        f"{'text PDFs of the corpus (all together)':42} {total_pages:5d} {total_pages / t_floor_sum:10.1f} "
        f"{total_pages / t_ours_sum:9.1f} {t_floor_sum / t_ours_sum:6.2f}"
    )

    t0 = time.perf_counter()
    isolated = extract(big, filename=BIG, settings=Settings())
    t_iso = time.perf_counter() - t0
    print()
    print(f"DA-619p through the isolated worker (cold worker, limits on): {t_iso:.2f} s = {n_big / t_iso:.1f} pages/s")
    print(f"DA-619p in process: {t_ours:.2f} s; floor {t_floor:.2f} s; ratio {t_floor / t_ours:.2f} (target >= 0.25)")
    print(
        f"DA-619p: {result.char_count:,} characters of Markdown, {result.stats['pages']} pages, "
        f"{result.stats['furniture_lines_removed']} header/footer lines removed; "
        f"peak RSS grew by {(rss_after - rss_before) / 1024:.0f} MiB in process"
    )
    assert isolated.markdown == result.markdown, "isolated and in-process results differ"

    if args.with_unstructured:
        from rag_pipeline.extraction.markdown import setup_unstructured

        setup_unstructured()
        from unstructured.partition.pdf import partition_pdf

        def run_unstructured(data: bytes) -> None:
            partition_pdf(file=io.BytesIO(data), strategy="fast")

        run_unstructured(warm)
        t_u = sum(timed(lambda d=(CORPUS / n).read_bytes(): run_unstructured(d), 1) for n in TEXT_PDFS)
        print(f"unstructured fast (pdfminer), text PDFs: {total_pages / t_u:.1f} pages/s ({t_floor_sum / t_u:.2f} of floor)")
        import pypdfium2 as pdfium

        src = pdfium.PdfDocument(big)
        part = pdfium.PdfDocument.new()
        part.import_pages(src, list(range(60)))
        buf = io.BytesIO()
        part.save(buf)
        t_u = timed(lambda: run_unstructured(buf.getvalue()), 1)
        print(f"unstructured fast (pdfminer), DA-619p first 60 pages: {60 / t_u:.1f} pages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
