"""A PostgreSQL 15 image made from this machine's Debian ``postgresql-15``: no registry.

The kind journeys (issue 32, docs/kind.md) need PostgreSQL inside the cluster, reached by
worker pods through a Service. The suite already runs Debian's ``postgresql-15`` binaries
on the host (``tests/support/postgres.py``), so the image is made from exactly those:

* ``/usr/lib/postgresql/15`` (``bin``: the server, ``initdb``, ``psql``; ``lib``: the
  modules ``initdb`` loads, such as ``plpgsql`` and the snowball dictionaries; not
  ``llvmjit``, whose LLVM would add 100 MiB for a JIT nobody here uses);
* ``/usr/share/postgresql/15`` (the catalog's bootstrap files, timezone sets);
* every shared library ``ldd`` names for them, copied (dereferenced) to the path ``ldd``
  printed, where the dynamic loader's built-in search finds it;
* the UTC zone file (Debian builds PostgreSQL with the system tz database);
* Debian's ``busybox-static`` as ``/bin/sh``: ``initdb`` starts the bootstrap backend
  through ``popen``, i.e. ``/bin/sh -c``, and the entrypoint is a shell script;
* an ``/etc/passwd`` naming uid 999 (``postgres`` refuses to run as a uid it cannot name).

The entrypoint initialises an empty data folder (trust authentication, also for the pod
network, since the journeys' database is throwaway and reached only inside the cluster)
and starts the server with ``fsync=off``. The archive is cached under
``<cache>/images/`` keyed by the server's version and the image's file list and scripts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

from joblease_localcluster import build, images
from joblease_localcluster.kindnode import binary_layer

PG_ROOT = Path("/usr/lib/postgresql/15")
PG_SHARE = Path("/usr/share/postgresql/15")
# Where they are in the image: where Debian puts them (the server finds its share folder
# relative to its own binary).
IMAGE_ROOT, IMAGE_SHARE = "usr/lib/postgresql/15", "usr/share/postgresql/15"
PG_PROGRAMS = ("postgres", "initdb", "psql")
SKIPPED_MODULES = ("llvmjit.so",)
ZONES = ("UTC", "Etc/UTC")
UID = 999
PASSWD = f"postgres:x:{UID}:{UID}:postgres:/var/lib/postgresql:/bin/sh\n"
GROUP = f"postgres:x:{UID}:\n"
PGDATA = "/var/lib/postgresql/data"
ENTRYPOINT_SCRIPT = f"""set -eu
if [ ! -s {PGDATA}/PG_VERSION ]; then
  initdb -D {PGDATA} -U postgres --auth=trust --no-locale -E UTF8
  echo 'host all all 0.0.0.0/0 trust' >> {PGDATA}/pg_hba.conf
fi
exec postgres -D {PGDATA} -c listen_addresses='*' -c unix_socket_directories=/tmp \\
  -c fsync=off -c full_page_writes=off
"""
REPOSITORY = "localhost/joblease-postgres"


def ldd_paths(output: str) -> list[str]:
    """Return the library paths of ``ldd``'s output (the loader included, the vDSO not).

    Raises:
        images.ImageError: a library is ``not found`` (the image would not start).

    """
    paths: list[str] = []
    for line in output.splitlines():  # bounded: one line per library
        line = line.strip()
        if "not found" in line:
            raise images.ImageError(f"ldd: {line}")
        target = line.split("=>", 1)[1].strip() if "=>" in line else line
        path = target.split(" (", 1)[0].strip()
        if path.startswith("/"):
            paths.append(path)
    return paths


def _ldd(binary: Path) -> list[str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False,
                         timeout=60)
    if out.returncode != 0:  # "not a dynamic executable": nothing to add
        return []
    return ldd_paths(out.stdout)


def _tree(root: Path, under: str) -> dict[str, Path]:
    """Every regular file below ``root``, at ``under`` + its relative path."""
    return {f"{under}/{p.relative_to(root)}": p for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def image_files(pg_root: Path = PG_ROOT, pg_share: Path = PG_SHARE) -> dict[str, Path]:
    """Return the image's files (path in the image → file here), libraries resolved.

    Raises:
        images.ImageError: Debian's postgresql-15 is not installed, or a library is missing.

    """
    programs = [pg_root / "bin" / name for name in PG_PROGRAMS]
    missing = [str(p) for p in programs if not p.is_file()]
    if missing or not pg_share.is_dir():
        raise images.ImageError(f"{', '.join(missing) or pg_share} missing: install Debian's "
                                "postgresql-15 (.ci/os-packages test)")
    modules = sorted(p for p in (pg_root / "lib").glob("*.so") if p.name not in SKIPPED_MODULES)
    files = {f"{IMAGE_ROOT}/bin/{p.name}": p for p in programs}
    files.update({f"{IMAGE_ROOT}/lib/{p.name}": p for p in modules})
    files.update(_tree(pg_share, IMAGE_SHARE))
    for binary in [*programs, *modules]:  # bounded: three programs and ~80 modules
        for lib in _ldd(binary):
            files.setdefault(lib.lstrip("/"), Path(os.path.realpath(lib)))
    for zone in ZONES:
        files[f"usr/share/zoneinfo/{zone}"] = Path(os.path.realpath(f"/usr/share/zoneinfo/{zone}"))
    return files


def _version(pg_root: Path) -> str:
    """The server's version (``15.18``): part of the image's name and cache key."""
    out = subprocess.run([str(pg_root / "bin" / "postgres"), "-V"], capture_output=True,
                         text=True, check=False, timeout=30)
    words = out.stdout.split()
    if out.returncode != 0 or len(words) < 3:
        raise images.ImageError(f"postgres -V failed: {out.stdout}{out.stderr}")
    return words[2]


def image_config() -> dict[str, object]:
    """The image's config: uid 999, the server's folder on PATH, UTC, the entrypoint."""
    return {"User": f"{UID}:{UID}",
            "Env": [f"PATH=/{IMAGE_ROOT}/bin:/bin", "TZ=UTC", f"PGDATA={PGDATA}"],
            "Entrypoint": ["/bin/sh", "-c", ENTRYPOINT_SCRIPT], "ExposedPorts": {"5432/tcp": {}}}


def postgres_archive(progress: build.Progress | None = None, pg_root: Path = PG_ROOT,
                     pg_share: Path = PG_SHARE) -> images.ImageArchive:
    """Return the PostgreSQL image archive, made from the host's postgresql-15 when missing.

    Raises:
        images.ImageError: postgresql-15 or busybox-static is missing (the message says).

    """
    progress = progress or build.Progress()
    files = image_files(pg_root, pg_share)
    version = _version(pg_root)
    key = hashlib.sha256(json.dumps([version, sorted(files), image_config(), PASSWD]).encode()
                         ).hexdigest()[:8]
    name = f"{REPOSITORY}:{version}-{key}"
    out = build.cache_dir() / "images" / f"postgres-{version}-{key}.tar"
    if out.is_file():
        progress.line(f"from cache: {name} ({out})")
        return images.ImageArchive(name, out)
    if not images._is_static(images.BUSYBOX):
        raise images.ImageError(f"{images.BUSYBOX} is missing or not static "
                                "(apt-get install busybox-static)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="joblease-pg-image-") as tmp:
        work = Path(tmp)
        (work / "passwd").write_text(PASSWD)
        (work / "group").write_text(GROUP)
        (work / "sh").symlink_to("busybox")
        layer = work / "layer.tar"
        with progress.step(f"making {name} from this machine's postgresql-15"):
            binary_layer({**files, "etc/passwd": work / "passwd", "etc/group": work / "group",
                          "bin/busybox": images.BUSYBOX, "bin/sh": work / "sh"}, layer)
            images.write_archive(name, [layer], image_config(), out)
    return images.ImageArchive(name, out)


__all__ = ["ENTRYPOINT_SCRIPT", "PG_ROOT", "image_config", "image_files", "ldd_paths",
           "postgres_archive"]
