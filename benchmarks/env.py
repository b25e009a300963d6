"""The benchmark's own environment: .venv-bench (tableq from this checkout plus the peers
pinned in benchmarks/requirements.txt, never dependencies of tableq), Debian's pgJDBC jar for
the Spark comparison, and a description of the machine and versions for RESULTS.md."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-bench"
PY = VENV / "bin" / "python"
REQUIREMENTS = ROOT / "benchmarks" / "requirements.txt"
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
PEERS = ("pgqueuer", "procrastinate", "pgmq", "huey", "persist-queue", "kombu", "SQLAlchemy",
         "asyncpg", "psycopg", "PyMySQL", "pyspark", "matplotlib")


def _stamp() -> str:
    h = hashlib.sha256()
    for f in (REQUIREMENTS, ROOT / "constraints.txt", ROOT / "pyproject.toml"):
        h.update(f.read_bytes())
    return h.hexdigest()


def _quiet(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")


def build_venv() -> None:
    """Creates or refreshes .venv-bench when requirements, constraints or pyproject changed."""
    stamp = VENV / ".installed"
    want = _stamp()
    if stamp.exists() and stamp.read_text() == want:
        return
    print("setting up .venv-bench (tableq + the peers, pinned) ...", file=sys.stderr)
    if not PY.exists():
        _quiet([sys.executable, "-m", "venv", str(VENV)])
        _quiet([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    _quiet([str(PY), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"),
            "-r", str(REQUIREMENTS), "-e", f"{ROOT}[all]"])
    stamp.write_text(want)


def ensure_jdbc() -> None:
    """Debian's pgJDBC jar (libpostgresql-jdbc-java), for Spark's JDBC reader and writer."""
    if JDBC_JAR.exists() or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    subprocess.run(["apt-get", "install", "-y", "-qq", "libpostgresql-jdbc-java"],
                   capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def ensure(argv: list[str]) -> None:
    """Makes sure this process runs in .venv-bench; re-executes there if not."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    build_venv()
    ensure_jdbc()
    os.execv(str(PY), [str(PY), "-m", "benchmarks", *argv])


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    out = {
        "machine": f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB, {platform.system()} "
                   f"{platform.release()}",
        "load_at_start": "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "tableq": f"{_version('tableq')} at {commit}{' (src modified)' if dirty else ''}",
        "peers": ", ".join(f"{p} {_version(p)}" for p in PEERS),
        "java": _java(),
        "jdbc": str(JDBC_JAR) if JDBC_JAR.exists() else "missing",
    }
    try:
        from pgmq.install import get_embedded_sql_version

        out["pgmq_sql"] = f"PGMQ SQL {get_embedded_sql_version()} (bundled in pgmq " \
                          f"{_version('pgmq')} from PyPI)"
    except Exception as exc:  # noqa: BLE001 - description only
        out["pgmq_sql"] = f"unavailable: {exc}"
    return out


def _java() -> str:
    if not shutil.which("java"):
        return "missing"
    proc = subprocess.run(["java", "-version"], capture_output=True, text=True)
    return (proc.stderr or proc.stdout).splitlines()[0] if (proc.stderr or proc.stdout) else "?"
