"""Where the tests get their PostgreSQL and MySQL/MariaDB servers from.

The one seam between the test suite and database servers. For each kind
(``"postgresql"`` or ``"mysql"``), :func:`provide` tries, in order:

1. a URL from ``DUCTWORK_TEST_POSTGRES_URL`` / ``DUCTWORK_TEST_MYSQL_URL``
   (skipped when ``require_container=True``);
2. a container started with testcontainers from the image named by
   ``DUCTWORK_TEST_POSTGRES_IMAGE`` / ``DUCTWORK_TEST_MYSQL_IMAGE`` (defaults:
   the official ``postgres:15`` and ``mysql:8.0``; ``mariadb:*`` images and the
   ``ductwork-local/*`` images built by ``.ci/containers`` work too), when a
   Docker engine answers at ``DOCKER_HOST`` (or the default socket);
3. otherwise a string: the reason to skip, saying exactly what is missing.

A container is published on a fixed host port of 127.0.0.1 (chosen free at
start), so its URL stays the same across :meth:`Server.kill` /
:meth:`Server.start` / :meth:`Server.restart`: a fleet under test reconnects to
the same address. Containers carry the label ``ductwork.tests=1`` and are
removed at interpreter exit; containers left by a process that died are
removed by the next :func:`provide`.

Session helpers: :func:`server_for_session` keeps one server per kind per
process (pytest-xdist runs each worker in its own process, so: one container
per worker); :func:`dedicated_server` starts one for a module (chaos tests that
kill or freeze their server own it); :func:`fresh_database` gives each worker
its own database on a shared server.

Typical conftest use::

    @pytest.fixture(scope="session")
    def pg_server(worker_id):                      # worker_id: pytest-xdist
        server = databases.server_for_session("postgresql", worker_id)
        if isinstance(server, str):
            pytest.skip(server)
        return server

    @pytest.fixture(scope="session")
    def pg_url(pg_server, worker_id):
        return databases.fresh_database(pg_server, databases.database_name(worker_id))

Nothing here sleeps to let things settle: every wait polls a condition against
a deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import random
import re
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

__all__ = [
    "KINDS",
    "NotAContainerError",
    "Server",
    "ServerError",
    "containers_required",
    "database_name",
    "dedicated_server",
    "docker_status",
    "drop_database",
    "fresh_database",
    "provide",
    "required",
    "server_for_session",
    "skip_or_fail",
    "stop_all",
]


@dataclass(frozen=True)
class _Kind:
    kind: str
    url_env: str
    image_env: str
    default_image: str
    port: int
    drivername: str


_KINDS = {
    "postgresql": _Kind(
        "postgresql",
        "DUCTWORK_TEST_POSTGRES_URL",
        "DUCTWORK_TEST_POSTGRES_IMAGE",
        "postgres:15",
        5432,
        "postgresql+psycopg",
    ),
    "mysql": _Kind(
        "mysql",
        "DUCTWORK_TEST_MYSQL_URL",
        "DUCTWORK_TEST_MYSQL_IMAGE",
        "mysql:8.0",
        3306,
        "mysql+pymysql",
    ),
}
KINDS = tuple(_KINDS)
_ALIASES = {"postgresql": "postgresql", "postgres": "postgresql", "pg": "postgresql",
            "mysql": "mysql", "mariadb": "mysql"}

# Credentials of the containers this module starts (throwaway servers).
_CONTAINER_USER = {"postgresql": "ductwork", "mysql": "root"}
_CONTAINER_PASSWORD = "ductwork"
_CONTAINER_DB = "ductwork"

_LABEL = "ductwork.tests"
_OWNER_LABEL = "ductwork.owner"
_SETUP_HINT = 'run `eval "$(.ci/containers)"` (or `. /tmp/ductwork-docker/env.sh` if it already ran)'


class ServerError(RuntimeError):
    """A database server could not be started, stopped or reached."""


class NotAContainerError(ServerError):
    """A container fault was asked of a server that is not a container."""


def _kind(kind: str) -> _Kind:
    try:
        return _KINDS[_ALIASES[kind.lower()]]
    except KeyError:
        raise ValueError(f"unknown database kind {kind!r}: use one of {', '.join(KINDS)}") from None


def _safe(url: str) -> str:
    """The URL with its password masked, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"


def _normalise_url(url: str, spec: _Kind) -> str:
    """Give a bare ``postgresql://`` / ``mysql://`` URL the project's driver."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend in ("postgresql", "postgres") and spec.kind == "postgresql" and "+" not in u.drivername:
        u = u.set(drivername="postgresql+psycopg")
    elif backend in ("mysql", "mariadb") and spec.kind == "mysql" and "+" not in u.drivername:
        u = u.set(drivername="mysql+pymysql")
    return u.render_as_string(hide_password=False)


def _connect_args(kind: str, timeout_s: float, *, bound_reads: bool = False) -> dict[str, Any]:
    """Driver arguments bounding the connect (and, for PyMySQL with
    ``bound_reads``, every read and write) to about ``timeout_s``."""
    if kind == "postgresql":
        return {"connect_timeout": max(2, math.ceil(timeout_s))}  # libpq's minimum is 2 s
    args: dict[str, Any] = {"connect_timeout": timeout_s}
    if bound_reads:
        args.update(read_timeout=timeout_s, write_timeout=timeout_s)
    return args


# --------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------


class Server:
    """A database server the tests may use: a URL, and a container if it is one.

    ``url`` is a SQLAlchemy URL (``postgresql+psycopg://…`` or
    ``mysql+pymysql://…``) whose user may create and drop databases.
    ``container`` is the testcontainers object, or None for a server from an
    environment URL; the fault methods raise :class:`NotAContainerError` then.
    """

    def __init__(
        self,
        url: str,
        kind: str,
        container: Any = None,
        *,
        source: str = "",
        image: str | None = None,
        owned: bool = False,
        startup_s: float | None = None,
    ) -> None:
        self.url = url
        self.kind = _kind(kind).kind
        self.container = container
        self.source = source
        self.image = image
        self.owned = owned
        self.startup_s = startup_s
        self._stopped = False

    def __repr__(self) -> str:
        where = f"container {self.container_name} ({self.image})" if self.container is not None else self.source
        return f"<Server {self.kind} {_safe(self.url)} from {where}>"

    # -- connections ------------------------------------------------------

    def connect_args(self, timeout_s: float = 5.0, *, bound_reads: bool = False) -> dict[str, Any]:
        """Driver arguments that bound connecting to ``timeout_s`` (with
        ``bound_reads``, PyMySQL's reads and writes too; psycopg has no such
        setting: use ``statement_timeout`` or a thread)."""
        return _connect_args(self.kind, timeout_s, bound_reads=bound_reads)

    def engine(self, url: str | None = None, *, timeout_s: float = 5.0, **kwargs: Any) -> sa.Engine:
        """An engine for ``url`` (default: the server's) with bounded connects."""
        kwargs.setdefault("connect_args", self.connect_args(timeout_s))
        return sa.create_engine(url or self.url, **kwargs)

    def answers(self, timeout_s: float = 2.0) -> bool:
        """True when a new connection runs ``SELECT 1`` within about ``timeout_s``."""
        try:
            self._probe(timeout_s)
        except Exception:
            return False
        return True

    def _probe(self, timeout_s: float) -> None:
        engine = sa.create_engine(
            self.url, poolclass=NullPool, connect_args=self.connect_args(timeout_s, bound_reads=True)
        )
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1")).scalar_one()
        finally:
            engine.dispose()

    def wait_ready(self, deadline_s: float = 60.0, *, interval_s: float = 0.1) -> float:
        """Poll new connections until one answers; return the seconds it took.

        Raises TimeoutError (with the last connection error) after ``deadline_s``.
        """
        t0 = time.monotonic()
        deadline = t0 + deadline_s
        last: BaseException | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                self._probe(min(2.0, max(remaining, 0.5)))
                return time.monotonic() - t0
            except Exception as exc:  # refused, starting up, recovering, timed out
                last = exc
            pause = min(interval_s, deadline - time.monotonic())
            if pause > 0:
                time.sleep(pause)  # polling interval, not a settle delay
        first_line = str(last).strip().splitlines()[0] if str(last).strip() else ""
        detail = f"{type(last).__name__}: {first_line}" if last else ""
        raise TimeoutError(f"{self!r} did not answer within {deadline_s:.1f} s (last error: {detail})")

    # -- container faults -------------------------------------------------

    def _docker(self) -> Any:
        """The docker-py Container object, or NotAContainerError."""
        if self.container is None:
            raise NotAContainerError(
                f"{self!r} is not a container, so it cannot be killed, restarted or paused; "
                "ask for one with provide(kind, require_container=True) or dedicated_server(kind)"
            )
        if self._stopped:
            raise ServerError(f"{self!r} was stopped (removed); it cannot be used again")
        return self.container.get_wrapped_container()

    @property
    def container_name(self) -> str | None:
        if self.container is None:
            return None
        try:
            return self.container.get_wrapped_container().name
        except Exception:
            return None

    @property
    def status(self) -> str:
        """The container's state (running, paused, exited, …) or "external"."""
        if self.container is None:
            return "external"
        c = self._docker()
        c.reload()
        return str(c.status)

    def _wait_status(self, wanted: set[str], deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        status = self.status
        while status not in wanted:
            if time.monotonic() > deadline:
                raise ServerError(f"{self!r} is {status!r}, not {sorted(wanted)} after {deadline_s} s")
            time.sleep(0.05)  # polling interval
            status = self.status

    def kill(self, signal: str = "SIGKILL") -> None:
        """Crash the server: signal the container (default SIGKILL), wait until it is down."""
        c = self._docker()
        c.kill(signal=signal)
        if signal in ("SIGKILL", "KILL", "9", 9):
            self._wait_status({"exited", "dead"}, 30)

    def start(self) -> None:
        """Start the container again after :meth:`kill` (same data, same URL).

        Returns once the container runs; use :meth:`wait_ready` to wait until
        the server answers (PostgreSQL runs crash recovery first).
        """
        self._docker().start()
        self._wait_status({"running"}, 30)

    def restart(self, timeout_s: int = 10) -> None:
        """Stop (stop signal, then SIGKILL after ``timeout_s``) and start the container."""
        self._docker().restart(timeout=timeout_s)
        self._wait_status({"running"}, timeout_s + 30)

    def pause(self) -> None:
        """Freeze every process of the server (connections stay open, nothing answers).

        The kernel's cgroup freezer cannot freeze a task in uninterruptible I/O (a server
        in the middle of an fsync): runc then thaws the container again and Docker answers
        500 "unable to freeze" (seen once in .ci/run, on MariaDB). That refusal leaves the
        container running, so it is asked again until a deadline; any other error raises.
        """
        import docker

        deadline = time.monotonic() + 30
        while True:
            try:
                self._docker().pause()
                break
            except docker.errors.APIError as error:
                if "unable to freeze" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the task's I/O finishes in milliseconds
        self._wait_status({"paused"}, 30)

    def unpause(self) -> None:
        """Thaw a paused server."""
        self._docker().unpause()
        self._wait_status({"running"}, 30)

    def stop(self) -> None:
        """Remove the container (if this process started it). Idempotent."""
        if self.container is None or self._stopped or not self.owned:
            return
        self._stopped = True
        with _LOCK:
            if self in _OWNED:
                _OWNED.remove(self)
        try:
            self.container.stop()
        except Exception as exc:  # already gone, engine down at exit
            warnings.warn(f"could not remove {self!r}: {exc}", RuntimeWarning, stacklevel=2)


# --------------------------------------------------------------------------
# Docker engine and testcontainers
# --------------------------------------------------------------------------

_LOCK = threading.RLock()
_OWNED: list[Server] = []
_SESSION: dict[tuple[str, bool], Server | str] = {}
_PULL_FAILURES: dict[str, str] = {}
_REAPED = False
_COUNTER = 0


def _docker_host_text() -> str:
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else "DOCKER_HOST unset (default socket unix:///var/run/docker.sock)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def docker_status() -> tuple[Any, str]:
    """``(client, "")`` when a Docker engine answers, else ``(None, reason)``."""
    try:
        import docker
    except ImportError:
        return None, "the docker package (testcontainers' dependency) is not installed: pip install -e '.[test]'"
    host = os.environ.get("DOCKER_HOST", "") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        # Probe the socket ourselves first: docker-py leaks a socket (a
        # ResourceWarning, an error under -W error) when the path is dead.
        path = host[len("unix://") :]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(5)
            try:
                probe.connect(path)
            except OSError as exc:
                return None, f"no Docker engine answers at {_docker_host_text()} ({_first_line(exc)}); {_SETUP_HINT}"
    try:
        client = docker.from_env(timeout=10)
    except Exception as exc:
        return None, f"no Docker engine at {_docker_host_text()} ({_first_line(exc)}); {_SETUP_HINT}"
    try:
        client.ping()
    except Exception as exc:
        client.close()
        return None, f"no Docker engine answers at {_docker_host_text()} ({_first_line(exc)}); {_SETUP_HINT}"
    return client, ""


def _is_local_engine() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    return host == "" or host.startswith(("unix://", "npipe://"))


def _testcontainers_classes() -> tuple[Any, Any, Any]:
    try:
        from testcontainers.community.mysql import MySqlContainer
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        with warnings.catch_warnings():  # testcontainers < 4.14 (no community namespace)
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.mysql import MySqlContainer
            from testcontainers.postgres import PostgresContainer
    from testcontainers.core.config import testcontainers_config

    return PostgresContainer, MySqlContainer, testcontainers_config


def _tune_testcontainers(config: Any, client: Any) -> None:
    """Defaults that suit a machine without a registry, unless the user set them."""
    ryuk_set = "TESTCONTAINERS_RYUK_DISABLED" in os.environ or "ryuk.disabled" in config.tc_properties
    if not ryuk_set and not config.ryuk_disabled:
        # Ryuk (the cleanup sidecar) needs its image; without it every start
        # fails. This module removes its containers itself.
        try:
            client.images.get(config.ryuk_image)
        except Exception:
            config.ryuk_disabled = True
    if "TC_POOLING_INTERVAL" not in os.environ and "TC_MAX_TRIES" not in os.environ:
        # Poll readiness every 0.1 s instead of every second; same 120 s limit.
        config.sleep_time = 0.1
        config.max_tries = 1200


def _reap_orphans(client: Any) -> None:
    """Remove containers of ours whose owning process (on this host) has died."""
    global _REAPED
    if _REAPED:
        return
    _REAPED = True
    me = socket.gethostname()
    try:
        containers = client.containers.list(all=True, filters={"label": f"{_LABEL}=1"})
    except Exception:
        return
    for c in containers:
        owner = c.labels.get(_OWNER_LABEL, "")
        host, _, pid = owner.rpartition(":")
        if host != me or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        with contextlib.suppress(Exception):
            c.remove(force=True, v=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ensure_image(client: Any, image: str, spec: _Kind) -> str:
    """"" when ``image`` is in the engine (pulling it if it can), else a reason."""
    try:
        client.images.get(image)
        return ""
    except Exception:
        pass
    if image in _PULL_FAILURES:
        return _PULL_FAILURES[image]
    try:
        client.images.pull(image)
        return ""
    except Exception as exc:
        local = []
        with contextlib.suppress(Exception):
            local = sorted(t for i in client.images.list() for t in i.tags if t.startswith("ductwork-local/"))
        hint = (
            f"images built here: {', '.join(local)}; set {spec.image_env} to one of them"
            if local
            else f"build local images with {_SETUP_HINT}"
        )
        reason = (
            f"image {image!r} ({spec.image_env or 'default'}) is not in the Docker engine at "
            f"{_docker_host_text()} and cannot be pulled ({_first_line(exc)}); {hint}"
        )
        _PULL_FAILURES[image] = reason
        return reason


def _free_port() -> int:
    """A port free on 127.0.0.1, outside the usual ephemeral range."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServerError("no free TCP port found on 127.0.0.1 in 20000-32000")


def _start_container(spec: _Kind, image: str, label: str) -> Server:
    global _COUNTER
    PostgresContainer, MySqlContainer, _ = _testcontainers_classes()
    local = _is_local_engine()
    with _LOCK:
        _COUNTER += 1
        n = _COUNTER
    safe_label = re.sub(r"[^A-Za-z0-9_.-]", "-", label)
    last: BaseException | None = None
    for _attempt in range(3):  # a chosen port may be taken before docker binds it
        name = f"ductwork-{spec.kind}-{safe_label}-{os.getpid()}-{n}-{_attempt}"
        common: dict[str, Any] = {
            "name": name,
            "labels": {_LABEL: "1", _OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}"},
        }
        if spec.kind == "postgresql":
            container = PostgresContainer(
                image,
                username=_CONTAINER_USER["postgresql"],
                password=_CONTAINER_PASSWORD,
                dbname=_CONTAINER_DB,
                driver="psycopg",
                stop_signal="SIGINT",  # fast shutdown, as the official image does
                **common,
            )
        else:
            container = MySqlContainer(
                image,
                dialect="pymysql",
                username=_CONTAINER_USER["mysql"],
                password=_CONTAINER_PASSWORD,
                dbname=_CONTAINER_DB,
                **common,
            )
        host_port: int | None = None
        if local:
            # Fixed host port on loopback: the URL survives kill/start/restart.
            host_port = _free_port()
            container.ports[str(spec.port)] = ("127.0.0.1", host_port)
        t0 = time.monotonic()
        try:
            container.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                container.stop()
            text = str(exc)
            if local and ("already allocated" in text or "address already in use" in text):
                last = exc
                continue
            raise ServerError(f"could not start a {spec.kind} container from {image!r}: {_first_line(exc)}") from exc
        if local:
            host = "127.0.0.1"
        else:
            host = container.get_container_host_ip()
            host_port = int(container.get_exposed_port(spec.port))
        url = sa.URL.create(
            spec.drivername,
            username=_CONTAINER_USER[spec.kind],
            password=_CONTAINER_PASSWORD,
            host=host,
            port=host_port,
            database=_CONTAINER_DB,
        ).render_as_string(hide_password=False)
        server = Server(url, spec.kind, container, source="container", image=image, owned=True)
        with _LOCK:
            _OWNED.append(server)
        try:
            server.wait_ready(60)
        except Exception:
            server.stop()
            raise
        server.startup_s = time.monotonic() - t0
        return server
    raise ServerError(f"could not publish a {spec.kind} container port after 3 tries: {last}")


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def provide(kind: str, *, require_container: bool = False, label: str = "test") -> Server | str:
    """A server of ``kind``, or the reason (a string) to skip.

    Order: the env URL (unless ``require_container``), then a new container
    from the env image (default ``postgres:15`` / ``mysql:8.0``) if a Docker
    engine answers. A container returned here is removed at interpreter exit
    (or by :meth:`Server.stop`). Errors other than a missing prerequisite
    (no URL, no engine, no image, no testcontainers) are raised, not skipped.
    """
    spec = _kind(kind)
    if not require_container:
        url = os.environ.get(spec.url_env, "").strip()
        if url:
            return Server(_normalise_url(url, spec), spec.kind, None, source=f"${spec.url_env}")
    why_no_url = "a container was required" if require_container else f"{spec.url_env} is not set"
    try:
        _testcontainers_classes()
    except ImportError as exc:
        return f"{why_no_url}, and testcontainers is not importable ({_first_line(exc)}): pip install -e '.[test]'"
    client, reason = docker_status()
    if client is None:
        return f"{why_no_url}, and {reason}"
    try:
        image = os.environ.get(spec.image_env, "").strip() or spec.default_image
        reason = _ensure_image(client, image, spec)
        if reason:
            return f"{why_no_url}, and {reason}"
        _, _, config = _testcontainers_classes()
        _tune_testcontainers(config, client)
        _reap_orphans(client)
    finally:
        client.close()
    return _start_container(spec, image, label)


def required(variable: str = "DUCTWORK_REQUIRE_CONTAINERS") -> bool:
    """True when the environment variable ``variable`` is set (1/true/yes/on): CI, where
    what it names must be there, and a skip would hide a test that never ran.
    ``DUCTWORK_REQUIRE_CONTAINERS``: the database containers;
    ``DUCTWORK_REQUIRE_PID_NAMESPACES``: ``unshare --pid`` (tests/integration/test_same_host_recovery.py)."""
    return os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on")


def containers_required() -> bool:
    """True when ``DUCTWORK_REQUIRE_CONTAINERS`` is set: a missing container is a failure,
    not a skip."""
    return required("DUCTWORK_REQUIRE_CONTAINERS")


def skip_or_fail(reason: str, variable: str = "DUCTWORK_REQUIRE_CONTAINERS") -> NoReturn:
    """``pytest.skip(reason)``, or ``pytest.fail`` when :func:`required` (``variable``)."""
    import pytest

    if required(variable):
        pytest.fail(f"{variable} is set, but: {reason}", pytrace=False)
    pytest.skip(reason)


def server_for_session(kind: str, worker_id: str | None = None, *, require_container: bool = False) -> Server | str:
    """One server (or skip reason) per kind per process, i.e. per xdist worker.

    The first call provides it; later calls return the same object. Containers
    are removed at exit. ``worker_id`` (pytest-xdist's fixture; "master"
    without xdist) only names the container.
    """
    spec = _kind(kind)
    key = (spec.kind, require_container)
    with _LOCK:
        if key not in _SESSION:
            label = worker_id or os.environ.get("PYTEST_XDIST_WORKER", "master")
            _SESSION[key] = provide(spec.kind, require_container=require_container, label=label)
        return _SESSION[key]


@contextlib.contextmanager
def dedicated_server(kind: str, *, label: str = "module") -> Iterator[Server | str]:
    """A container of one's own for a module (e.g. a chaos test that kills it).

    Yields the Server (always a container) or the skip reason; removes the
    container on exit.
    """
    result = provide(kind, require_container=True, label=label)
    try:
        yield result
    finally:
        if isinstance(result, Server):
            result.stop()


def database_name(worker_id: str | None = None, prefix: str = "ductwork_test", *, unique: bool = False) -> str:
    """``ductwork_test_gw0`` for xdist worker gw0 (``ductwork_test_master`` without).

    With ``unique=True`` a per-run suffix is added (xdist's run id, else the
    pid), so that two test runs sharing one server never drop each other's
    database.
    """
    worker = worker_id or os.environ.get("PYTEST_XDIST_WORKER", "master")
    name = f"{prefix}_{worker}"
    if unique:
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:8] or str(os.getpid())
        name = f"{name}_{run}"
    return re.sub(r"[^a-z0-9_]", "_", name.lower())[:63]


_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _admin_engine(server: Server, name: str) -> sa.Engine:
    if not _NAME_RE.match(name):
        raise ValueError(f"database name {name!r} must match {_NAME_RE.pattern}")
    if make_url(server.url).database == name:
        raise ValueError(f"{name!r} is the server URL's own database; choose another name")
    return sa.create_engine(
        server.url, poolclass=NullPool, isolation_level="AUTOCOMMIT", connect_args=server.connect_args(10)
    )


def drop_database(server: Server, name: str) -> None:
    """Drop database ``name`` on ``server`` if it exists (closing its connections on PostgreSQL)."""
    engine = _admin_engine(server, name)
    try:
        with engine.connect() as conn:
            _drop(conn, server.kind, name)
    finally:
        engine.dispose()


def _drop(conn: sa.Connection, kind: str, name: str) -> None:
    if kind == "postgresql":
        if (conn.dialect.server_version_info or (0,)) >= (13,):
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        else:  # before PostgreSQL 13: end the sessions, then drop
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name}
            )
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    else:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))


def fresh_database(server: Server, name: str) -> str:
    """Create an empty database ``name`` on ``server`` (dropping any old one); return its URL."""
    engine = _admin_engine(server, name)
    try:
        with engine.connect() as conn:
            _drop(conn, server.kind, name)
            if server.kind == "postgresql":
                conn.execute(sa.text(f'CREATE DATABASE "{name}" ENCODING \'UTF8\' TEMPLATE template0'))
            else:
                conn.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    finally:
        engine.dispose()
    return make_url(server.url).set(database=name).render_as_string(hide_password=False)


def stop_all() -> None:
    """Remove every container this process started (run at exit too)."""
    with _LOCK:
        owned = list(_OWNED)
        _SESSION.clear()
    for server in owned:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.stop()


atexit.register(stop_all)
