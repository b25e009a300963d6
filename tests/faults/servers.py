"""Throwaway database servers for fault tests: a PostgreSQL cluster made with initdb and a
mariadbd with its own datadir, each on a free loopback port, owned by the test. They can be
crashed (immediate stop, kill -9), restarted and stopped at will; the shared servers on 5432
and 3306 are never touched. Running as root, the servers run as the distribution's postgres
and mysql users (initdb and mariadbd refuse root)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

PG_BIN = Path(os.environ.get("TABLEQ_TEST_PG_BIN", "")) if os.environ.get(
    "TABLEQ_TEST_PG_BIN") else None
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin() -> Path:
    if PG_BIN is not None:
        return PG_BIN
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql; install "
                           "postgresql or set TABLEQ_TEST_PG_BIN")
    return found[-1].parent


def _as_user(user: str) -> list[str]:
    """A command prefix that runs as `user` when we are root (servers refuse root)."""
    return ["runuser", "-u", user, "--"] if os.geteuid() == 0 else []


def _own_dir(prefix: str, user: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def _wait_port(port: int, timeout_s: float, alive: callable = lambda: True) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the server exited while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


class ThrowawayPostgres:
    """A PostgreSQL cluster of our own. `url(schema)` points tableq at it."""

    dialect = "postgres"

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.root = _own_dir("tq-pg-", "postgres")
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.settings = {"listen_addresses": "127.0.0.1", "unix_socket_directories":
                         str(self.root), "max_connections": "200", "fsync": "on",
                         "synchronous_commit": "on", "shared_buffers": "64MB",
                         **(settings or {})}
        self.crashes = 0
        bin_ = _pg_bin()
        self._pg_ctl = str(bin_ / "pg_ctl")
        subprocess.run([*_as_user("postgres"), str(bin_ / "initdb"), "-D", str(self.data),
                        "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True)

    def _options(self) -> str:
        return " ".join(f"-c {k}={v}" for k, v in self.settings.items()) + f" -p {self.port}"

    def _ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*_as_user("postgres"), self._pg_ctl, "-D", str(self.data),
                               *args], check=check, capture_output=True,
                              timeout=START_TIMEOUT_S + 10)

    def start(self) -> None:
        self._ctl("-l", str(self.log), "-w", "-t", str(int(START_TIMEOUT_S)),
                  "-o", self._options(), "start")

    def is_running(self) -> bool:
        return self._ctl("status", check=False).returncode == 0

    def crash(self, how: str = "immediate") -> None:
        """Stops without a shutdown checkpoint, so the next start runs crash recovery:
        'immediate' is pg_ctl stop -m immediate, 'kill9' a SIGKILL of the postmaster."""
        self.crashes += 1
        if how == "immediate":
            self._ctl("stop", "-m", "immediate", "-w")
            return
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        # The children notice their parent died and exit; wait until the port is free.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    time.sleep(0.05)
            except OSError:
                break
        lingering = self.data / "postmaster.pid"
        if lingering.exists():
            lingering.unlink()

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def restart(self, down_s: float = 0.0) -> None:
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        if self.is_running():
            self._ctl("stop", "-m", "fast", "-w", check=False)

    def destroy(self) -> None:
        try:
            self.stop()
            if self.is_running():
                self._ctl("stop", "-m", "immediate", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, schema: str = "tableq", **params: str) -> str:
        extra = "".join(f"&{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?schema={schema}{extra}"

    def admin(self):  # type: ignore[no-untyped-def]
        """An autocommit psycopg connection as the superuser."""
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname="postgres", autocommit=True, connect_timeout=5)

    def sql(self, statement: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        with self.admin() as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []


class ThrowawayMariaDB:
    """A mariadbd of our own with its own datadir. `url(database)` points tableq at it."""

    dialect = "mysql"

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.root = _own_dir("tq-maria-", "mysql")
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.settings = {"innodb-buffer-pool-size": "64M", "innodb-flush-log-at-trx-commit":
                         "1", "skip-name-resolve": None, "max-connections": "300",
                         **(settings or {})}
        self.crashes = 0
        self._proc: subprocess.Popen[bytes] | None = None
        install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if install is None:
            raise RuntimeError("mariadb-install-db not found; install mariadb-server")
        subprocess.run([install, "--no-defaults", f"--datadir={self.data}", "--user=mysql",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True)

    def _command(self) -> list[str]:
        args = ["mariadbd", "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
                "--bind-address=127.0.0.1", f"--socket={self.root}/mysqld.sock",
                f"--pid-file={self.root}/mysqld.pid", f"--log-error={self.log}"]
        if os.geteuid() == 0:
            args.append("--user=mysql")
        for k, v in self.settings.items():
            args.append(f"--{k}" if v is None else f"--{k}={v}")
        return [shutil.which("mariadbd") or "/usr/sbin/mariadbd", *args[1:]]

    def start(self) -> None:
        self._proc = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        proc = self._proc
        _wait_port(self.port, START_TIMEOUT_S, alive=lambda: proc.poll() is None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the port opens before the server accepts logins
            try:
                self.admin().close()
                return
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def crash(self, how: str = "kill9") -> None:
        """kill -9 of mariadbd: InnoDB runs crash recovery at the next start."""
        assert self._proc is not None
        self.crashes += 1
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(30)

    def restart(self, down_s: float = 0.0) -> None:
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        if self.is_running():
            assert self._proc is not None
            self._proc.terminate()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "tableq") -> str:
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{database}` CHARACTER SET utf8mb4 "
                        "COLLATE utf8mb4_bin")
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def admin(self):  # type: ignore[no-untyped-def]
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="",
                               autocommit=True, connect_timeout=5)

    def sql(self, statement: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params or None)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()
