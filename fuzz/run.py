"""Run the fuzz targets for a given time: ``python -m fuzz.run --seconds N [--target X ...] [--engine E]``.

Engines: ``hypothesis`` (in-process: batches of ``@given`` runs, no per-example deadline, a fresh seed per
batch, until the time is up) and ``atheris`` (coverage-guided libFuzzer over
``test.hypothesis.fuzz_one_input``, ``rag_pipeline`` instrumented; one child process per target, in an
interpreter that has atheris: ``--python`` or ``$FUZZ_ATHERIS_PYTHON``, see ``fuzz/README.md``). ``auto``
(default) picks atheris when such an interpreter exists. A finding is reported once per signature
(exception type and innermost ``rag_pipeline``/``fuzz`` frame) with its input, then ignored so the run
explores past it; examples slower than ``FUZZ_SLOW_S`` (5 s) are listed. Exit code 1 when a target found
something not in ``fuzz/known.py`` (or anything at all, with ``--strict``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

TARGETS = ["clean", "chunking", "tables", "partitions", "detect", "zotero", "gdrive", "sharepoint"]
# modules to instrument (imported inside atheris.instrument_imports) besides what the target imports
MODULES = {
    "clean": ["rag_pipeline.extraction.clean"],
    "chunking": ["rag_pipeline.chunking.markdown"],
    "tables": ["rag_pipeline.extraction.tables", "rag_pipeline.chunking.markdown", "lxml.html"],
    "partitions": ["rag_pipeline.defs.documents.partitions"],
    "detect": ["rag_pipeline.extraction.detect", "rag_pipeline.extraction.text_formats", "olefile", "magic"],
    "zotero": ["rag_pipeline.sources.zotero", "rag_pipeline.store.write"],
    "gdrive": ["rag_pipeline.sources.gdrive", "rag_pipeline.store.write"],
    "sharepoint": ["rag_pipeline.sources.sharepoint", "rag_pipeline.store.write"],
}
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Finding:
    signature: list[str]
    error: str
    detail: str
    known: str | None = None


@dataclass
class Result:
    target: str
    engine: str
    seconds: float
    examples: int = 0
    checks: int = 0
    coverage: str | None = None
    findings: list[Finding] = field(default_factory=list)
    known_hits: int = 0
    slow: list[list] = field(default_factory=list)
    note: str = ""


def load(name: str):
    import logging

    logging.getLogger("rag_pipeline").setLevel(logging.CRITICAL)  # connectors log every incomplete listing
    return importlib.import_module(f"fuzz.target_{name}").TARGET


def _describe(exc: BaseException) -> tuple[str, str]:
    head = f"{type(exc).__name__}: {str(exc)[:500]}"
    notes = "\n".join(getattr(exc, "__notes__", []))
    tb = "".join(traceback.format_exception(exc, limit=-4))
    return head, (notes + "\n" + tb)[-4000:]


def _record(result: Result, exc: BaseException) -> None:
    from fuzz import known
    from fuzz.common import IGNORED, signature

    group = getattr(exc, "exceptions", None)  # Hypothesis' FlakyFailure/ExceptionGroup: report the cause
    inner = group[0] if group else exc
    sig = signature(inner)
    IGNORED.add(sig)
    head, detail = _describe(inner)
    result.findings.append(Finding(list(sig), head, detail, known.match(sig, head, result.target)))


def run_hypothesis(name: str, seconds: float, seed: int = 0, batch: int = 20) -> Result:
    """Time-boxed Hypothesis run of one target, in this process."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis import seed as with_seed

    from fuzz.common import STATS

    target = load(name)
    result = Result(name, "hypothesis", seconds)
    start = time.monotonic()
    stop = start + seconds
    before = (STATS.examples, STATS.executions, sum(STATS.known.values()), len(STATS.slow))
    i = 0
    previous = target.test._hypothesis_internal_use_settings
    while time.monotonic() < stop:
        left = stop - time.monotonic()
        phases = [Phase.generate, Phase.shrink] if left > 20 else [Phase.generate]
        # @given fixed its settings at import; replace them per batch (no public way to re-decorate)
        target.test._hypothesis_internal_use_settings = settings(
            max_examples=batch, deadline=None, database=None, phases=phases, suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False)
        test = with_seed(seed + i)(target.test)
        i += 1
        began, done = time.monotonic(), STATS.examples
        try:
            test()
        except Exception as exc:  # noqa: BLE001 - a finding
            _record(result, exc)
        per_example = (time.monotonic() - began) / max(1, STATS.examples - done)
        batch = max(5, min(2000, int(min(2.0, seconds / 4) / max(per_example, 1e-4))))  # <= 2 s per batch
    target.test._hypothesis_internal_use_settings = previous
    result.seconds = round(time.monotonic() - start, 1)
    result.examples = STATS.examples - before[0]
    result.checks = STATS.executions - before[1]
    result.known_hits = sum(STATS.known.values()) - before[2]
    result.slow = [list(s) for s in STATS.slow[before[3]:]]
    result.note = f"{i} batches, seeds {seed}..{seed + i - 1}"
    return result


# --- atheris -----------------------------------------------------------------------------------------


def _atheris_child(name: str, summary: Path) -> None:
    """Inside the atheris interpreter: instrument, then fuzz one target until libFuzzer stops."""
    import atheris
    from hypothesis import HealthCheck, settings

    with atheris.instrument_imports(include=["rag_pipeline", "fuzz"]):
        for module in MODULES.get(name, []):
            importlib.import_module(module)
        target = load(name)
    from fuzz.common import STATS

    test = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))(target.test)
    fuzz_one = test.hypothesis.fuzz_one_input
    result = Result(name, "atheris", 0)
    last_write = [0.0]

    def write(force: bool = False) -> None:
        now = time.monotonic()
        if force or now - last_write[0] > 2:
            last_write[0] = now
            result.examples, result.checks = STATS.examples, STATS.executions
            result.known_hits = sum(STATS.known.values())
            result.slow = [list(s) for s in STATS.slow]
            summary.write_text(json.dumps(asdict(result)))

    def one_input(data: bytes) -> None:
        try:
            fuzz_one(data)
        except Exception as exc:  # noqa: BLE001 - report once, keep fuzzing
            _record(result, exc)
            write(force=True)
            print(f"FUZZ-FINDING {result.findings[-1].error}", file=sys.stderr, flush=True)
        write()

    atheris.Setup(sys.argv[:1] + [a for a in sys.argv[1:] if a.startswith("-") and "=" in a], one_input)
    atheris.Fuzz()


def atheris_python(explicit: str | None) -> str | None:
    """An interpreter that can import atheris and this project, or ``None``."""
    for candidate in (explicit, os.environ.get("FUZZ_ATHERIS_PYTHON"), sys.executable):
        if not candidate:
            continue
        probe = subprocess.run([candidate, "-c", "import atheris, hypothesis, rag_pipeline"], cwd=REPO,
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return candidate
    return None


def run_atheris(name: str, seconds: float, python: str, workdir: Path, timeout_s: int = 20) -> Result:
    """Run one target under atheris in a child process (restarted after a libFuzzer crash/timeout)."""
    result = Result(name, "atheris", seconds)
    start = time.monotonic()
    restarts = 0
    covs: list[str] = []
    while True:
        left = int(seconds - (time.monotonic() - start))
        if left < 2:
            break
        summary = workdir / f"{name}-{restarts}.json"
        artifacts = workdir / f"{name}-artifacts"
        artifacts.mkdir(exist_ok=True)
        cmd = [python, "-m", "fuzz.run", "--atheris-child", name, "--summary", str(summary),
               f"-max_total_time={left}", f"-timeout={timeout_s}", "-rss_limit_mb=6144", "-max_len=16384",
               "-print_final_stats=1", f"-artifact_prefix={artifacts}/"]
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=left + 60)
            log, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:  # one input ran past the whole budget: a hang
            log = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
            code = -9
            result.findings.append(Finding(["hang", name], f"the child ran {left + 60}s past its budget", log[-3000:]))
        (workdir / f"{name}-{restarts}.log").write_text(log)
        part = json.loads(summary.read_text()) if summary.exists() else {}
        result.examples += part.get("examples", 0)
        result.checks += part.get("checks", 0)
        result.known_hits += part.get("known_hits", 0)
        result.slow += part.get("slow", [])
        result.findings += [Finding(**f) for f in part.get("findings", [])]
        covs += re.findall(r"cov: (\d+) ft: (\d+)", log)[-1:]
        crash = re.search(r"==\d+== ERROR: libFuzzer: ([^\n]+)|ERROR: libFuzzer: ([^\n]+)", log)
        if code != 0 and crash:
            what = (crash.group(1) or crash.group(2)).strip()
            files = sorted(str(p) for p in artifacts.iterdir())
            result.findings.append(Finding(["libFuzzer", what], what, log[-3000:] + f"\nartifacts: {files[-3:]}"))
            restarts += 1
            if restarts > 5:
                break
            continue
        if code != 0:
            result.note += f" child exit {code}: {log[-800:]}"
        break
    result.seconds = round(time.monotonic() - start, 1)
    if covs:
        result.coverage = f"cov {max(int(c) for c, _ in covs)} edges, ft {max(int(f) for _, f in covs)} features (libFuzzer, rag_pipeline instrumented)"
    return result


# --- main --------------------------------------------------------------------------------------------


def report(result: Result, out=sys.stdout) -> None:
    new = [f for f in result.findings if not f.known]
    print(f"== {result.target} [{result.engine}] {result.seconds}s: {result.examples} examples, {result.checks} checks"
          + (f", {result.coverage}" if result.coverage else "")
          + f"; findings: {len(result.findings)} ({len(new)} new), known hits {result.known_hits}, slow {len(result.slow)}",
          file=out)
    for f in result.findings:
        print(f"  - {'known (' + f.known + ')' if f.known else 'NEW'} {f.signature[0]} at {f.signature[1]}: {f.error[:300]}",
              file=out)
        inputs = [line for line in f.detail.splitlines() if line.startswith("fuzz input:")]
        if inputs:
            print(f"      {inputs[0][:400]}", file=out)
    for elapsed, what in result.slow[:5]:
        print(f"  - slow example {elapsed:.1f}s: {what[:200]}", file=out)
    if result.note.strip():
        print(f"  note: {result.note.strip()[:800]}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="time per target (default 60)")
    parser.add_argument("--target", action="append", choices=TARGETS, help="a target (repeatable; default all)")
    parser.add_argument("--engine", choices=["auto", "hypothesis", "atheris"], default="auto")
    parser.add_argument("--python", help="interpreter with atheris (default $FUZZ_ATHERIS_PYTHON, then this one)")
    parser.add_argument("--seed", type=int, default=0, help="first Hypothesis seed (hypothesis engine)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--strict", action="store_true", help="exit 1 on known findings too")
    parser.add_argument("--timeout", type=int, default=20,
                        help="atheris: seconds (wall clock) one input may take before it counts as a hang (default 20; "
                             "raise it on a loaded machine or under nice, where a slice of a core stretches every input)")
    parser.add_argument("--atheris-child", help=argparse.SUPPRESS)
    parser.add_argument("--summary", type=Path, help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args(argv)
    if args.atheris_child:
        sys.argv = [sys.argv[0], *extra]
        _atheris_child(args.atheris_child, args.summary)
        return 0
    engine, python = args.engine, None
    if engine in ("auto", "atheris"):
        python = atheris_python(args.python)
        if python is None and engine == "atheris":
            parser.error("no interpreter with atheris (see fuzz/README.md)")
        engine = "atheris" if python else "hypothesis"
    workdir = Path(tempfile.mkdtemp(prefix="fuzz-run-"))
    results = []
    for name in args.target or TARGETS:
        if engine == "atheris":
            result = run_atheris(name, args.seconds, python, workdir, args.timeout)
        else:
            result = run_hypothesis(name, args.seconds, seed=args.seed)
        report(result)
        sys.stdout.flush()
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if engine == "atheris":
        print(f"logs and crash artifacts: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    bad = [f for r in results for f in r.findings if args.strict or not f.known]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
