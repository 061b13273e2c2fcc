"""File output: write to a temporary file beside the target, rename on success, delete on failure, so no
reader ever sees a half-written checkpoint, ONNX model, engine or report; check that an output folder can be
written before any work starts; the one cache folder every command uses, whose derived files are trusted by
content (:func:`derived_is_current`), never by modification time, in a folder that is the user's alone
(:func:`private_dir`) where they can hold code (a compiled program, an engine).

A temporary file or folder is named after the process that owns it, ``.<name>.<host>.<pid>.<random>.tmp``
beside ``<name>`` (:func:`temporary_sibling`, :func:`atomic_path`) or ``<prefix><host>.<pid>.<random>`` in the
system's temporary folder (:func:`temporary_folder`): a process killed with ``kill -9`` cannot remove its own, so
the next one that writes the same target (or uses the same prefix) removes every one whose process no longer runs
on this host (:func:`remove_dead_temporaries`). Another host's (a shared network folder) are left alone."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_path",
    "temporary_sibling",
    "temporary_folder",
    "remove_dead_temporaries",
    "no_space_problem",
    "atomic_write_bytes",
    "save_png",
    "atomic_write_text",
    "write_json_report",
    "sha256_file",
    "derived_is_current",
    "derived_facts",
    "record_derived",
    "writable_dir",
    "private_dir",
    "cache_subdir",
    "default_cache_dir",
    "parse_json",
    "read_json",
    "CACHE_ENV",
    "MAX_JSON_BYTES",
]

#: Environment variable naming the cache folder (zoo ONNX exports, TensorRT engines, benchmark models).
CACHE_ENV = "ATTNZOO_CACHE"

PathLike = str | Path
#: Largest JSON file :func:`read_json` reads whole (a training state, a manifest).
MAX_JSON_BYTES = 64 * 2**20


def _read_umask() -> int:
    mask = os.umask(0)  # the only portable way to read it; done once, at import, before any threads
    os.umask(mask)
    return mask


_UMASK = _read_umask()
#: This host in a temporary file's name (letters, digits and ``-``; its first 16).
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:16] or "host"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts: it cannot be signalled, but it is there;
    off POSIX every process counts as running, since ``os.kill`` there would end it)."""
    if pid == os.getpid() or os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process
        return True
    return True


def remove_dead_temporaries(folder: PathLike, lead: str, tail: str = r"\.tmp(?:\.[A-Za-z0-9]+)?") -> list[Path]:
    """Remove the temporary files and folders in ``folder`` named ``<lead><host>.<pid>.<random><tail>`` whose
    process no longer runs on this host (killed before it could clean up); return those removed. ``lead`` is
    ``.<name>.`` for the siblings of ``<name>`` (:func:`temporary_sibling`), a prefix for :func:`temporary_folder`;
    ``tail`` is a regular expression (default: ``.tmp`` and an optional suffix, ``.tmp.pt2``)."""
    pattern = re.compile(re.escape(f"{lead}{_HOST}.") + r"(\d+)\.[a-z0-9_]+" + tail)
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:  # gone already (another process cleaned it), or not ours to remove
            continue
    return removed


def temporary_sibling(path: PathLike, suffix: str = "") -> Path:
    """Create an empty temporary file beside ``path``, ``.<name>.<host>.<pid>.<random>.tmp<suffix>`` (a library
    that insists on a suffix gets it: ``.xml``), after removing the ones of ``path`` that a dead process left
    (:func:`remove_dead_temporaries`); the caller renames or removes it."""
    path = Path(path)
    lead = _sibling_lead(path)
    remove_dead_temporaries(path.parent, lead)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{lead}{_HOST}.{os.getpid()}.", suffix=f".tmp{suffix}")
    os.close(fd)
    return Path(name)


def _sibling_lead(path: Path) -> str:
    """``.<name>.``, the start of a temporary sibling's name (the name's first 160 characters: room for the rest in
    a file name's 255)."""
    return f".{path.name[:160]}."


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder in the system's (``<prefix><host>.<pid>.<random>``, mode 0700), removed with what it holds
    on the way out, whatever happened; the ones of ``prefix`` that a dead process left are removed first."""
    remove_dead_temporaries(tempfile.gettempdir(), prefix, tail="")
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{_HOST}.{os.getpid()}."))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (:func:`temporary_sibling`); on success it becomes ``path`` (mode 0666
    & ~umask, like a normally created file), on any exception it is removed; after a kill, by the next writer of
    ``path`` (with ``<temporary>.<suffix>``, a name derived from it: AOTInductor's ``.pt2``)."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def save_png(fig: Any, path: Path, dpi: int) -> Path:
    """Lay out a matplotlib figure, write it to ``path`` as a PNG atomically, close it; returns ``path``."""
    import io

    import matplotlib.pyplot as plt  # optional, heavy: matplotlib

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


#: ``errno`` of a write that found no room: a full disk, a full quota.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
#: What libraries say of a write that found no room, in messages that carry no ``errno``.
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded")
#: A library's bare I/O error, with no reason (OpenVINO's C++ streams): a full disk when the folder has no room.
_BARE_IO_ERROR = ("iostream error", "basic_ios::clear")


def _caused(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (at most 8)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def no_space_problem(exc: BaseException, folder: PathLike | None = None, needed: int = 0) -> str | None:
    """The line that names a full disk as the reason for ``exc`` (a write that failed), or None when it is another:
    an ``OSError`` with ``ENOSPC`` or ``EDQUOT``, a library's message that says so, or a library's bare I/O error
    (OpenVINO's ``basic_ios::clear: iostream error``) while ``folder``, where it was writing, has less than
    ``needed`` bytes (and at least 1 MiB) free. The line names the folder and its free space."""
    where = Path(folder) if folder is not None else None
    full = False
    for e in _caused(exc):
        text = str(e)
        name = getattr(e, "filename", None)  # an OSError's: the file it was writing
        if isinstance(name, str) and name:
            where = Path(name).parent
        if (isinstance(e, OSError) and e.errno in _NO_SPACE) or any(t in text for t in _NO_SPACE_TEXT):
            full = True
            break
        if folder is not None and any(t in text for t in _BARE_IO_ERROR):
            free = _free_bytes(Path(folder))
            if free is not None and free < max(needed, 2**20):
                full, where = True, Path(folder)
                break
    if not full:
        return None
    free = _free_bytes(where) if where is not None else None
    room = (
        f" ({free / 1e6:.1f} MB free{f', about {needed / 1e6:.1f} MB needed' if needed else ''})"
        if free is not None
        else ""
    )
    place = f" in {where}" if where is not None else ""
    return (
        f"the disk is full: no space left on device{place}{room}; free some space and run it again (the model is "
        "not at fault)"
    )


def _free_bytes(folder: Path) -> int | None:
    """Bytes free for this user in ``folder``'s file system, or None when it cannot be read."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def write_json_report(result: Any, out: PathLike | None = None) -> None:
    """Print ``result`` as JSON and, with ``out``, write it there whole (a measuring command's output)."""
    print(json.dumps(result, indent=1))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(result, indent=1) + "\n")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(data: str | bytes) -> Any:
    """``json.loads`` without NaN / Infinity, and with nesting too deep for its decoder (which recurses once per
    level) a ``ValueError`` instead of a ``RecursionError``."""
    try:
        return json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def read_json(path: PathLike, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON file read with bounds (:func:`parse_json`; its size checked before it is read).

    Raises:
        ValueError: one line naming the file: missing or not a regular file, over ``max_bytes``, not UTF-8, not
            JSON, NaN / Infinity, or nested too deep.
    """
    path = Path(path)
    try:
        if not path.is_file():
            raise ValueError("missing or not a regular file")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError(f"over the {max_bytes:,} bytes such a file can be")
        return parse_json(data.decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path}: not readable JSON ({getattr(exc, 'strerror', None) or exc})") from None


def sha256_file(path: PathLike) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _derived_facts(source_sha256: str, products: list[Path], key: dict[str, Any]) -> dict[str, Any]:
    return {
        "source_sha256": source_sha256,
        "key": json.loads(json.dumps(key, sort_keys=True, default=str)),  # as the record holds it once read back
        "products": {p.name: sha256_file(p) for p in products},
    }


def derived_facts(
    record: PathLike, source_sha256: str, products: Sequence[PathLike], key: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The facts :func:`record_derived` kept with the cached ``products`` (``{}`` when it kept none) when they are
    current (:func:`derived_is_current`), else ``None``."""
    paths = [Path(p) for p in products]
    try:
        if not all(p.is_file() for p in paths):
            return None
        want = read_json(record, max_bytes=2**20)
        if not isinstance(want, dict):
            return None
        have = _derived_facts(source_sha256, paths, dict(key or {}))
        if any(want.get(name) != value for name, value in have.items()):
            return None
        facts = want.get("facts", {})
        return facts if isinstance(facts, dict) else None
    except (OSError, ValueError):
        return None


def derived_is_current(
    record: PathLike, source_sha256: str, products: Sequence[PathLike], key: dict[str, Any] | None = None
) -> bool:
    """Whether the cached ``products`` made from a source whose content is ``source_sha256`` (with settings
    ``key``) are the very files :func:`record_derived` recorded in ``record``: the same source content and key,
    and each product's own sha256 unchanged. A cache is trusted by content, never by modification time or name: a
    product replaced or edited after it was made (an equivalent graph dropped in its place, a half-copied file, a
    program planted at its name) or one with no record reads as not current, and the caller makes it again (never
    opening it)."""
    return derived_facts(record, source_sha256, products, key) is not None


def record_derived(
    record: PathLike,
    source_sha256: str,
    products: Sequence[PathLike],
    key: dict[str, Any] | None = None,
    facts: dict[str, Any] | None = None,
) -> None:
    """Write ``record`` (atomically, after the products are in place): the source's sha256, ``key`` and every
    product's sha256, read back by :func:`derived_is_current`, and ``facts`` (how they were made), read back by
    :func:`derived_facts`."""
    made = _derived_facts(source_sha256, [Path(p) for p in products], dict(key or {}))
    if facts is not None:
        made["facts"] = json.loads(json.dumps(facts, default=str))
    atomic_write_text(record, json.dumps(made, indent=1, sort_keys=True) + "\n")


def writable_dir(folder: PathLike, what: str = "output folder") -> Path:
    """Create ``folder`` if needed and prove it writable by creating and removing a file in it.

    Raises:
        ValueError: one line naming ``what`` and the reason (a file in the way, no permission, read-only).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the {what} {folder} is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the {what} {folder}: {exc.strerror or exc}") from None
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"the {what} {folder} cannot be written: {exc.strerror or exc}") from None
    return folder


def private_dir(folder: PathLike, what: str = "cache folder") -> Path:
    """Create ``folder`` if needed (mode 0700: the user's alone; parents as needed) and check that it is the
    user's alone, as a folder whose files are run (compiled programs, engines) must be: a record beside a file
    that another user could plant proves nothing.

    Raises:
        ValueError: one line naming ``what``, the folder and what is wrong: not a folder, owned by another user
            (or reached through another user's link), writable by its group or by others, or not writable.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the {what} {folder} is not a folder")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        link, st = folder.lstat(), folder.stat()  # a link's own owner counts too: it can point elsewhere later
    except OSError as exc:
        raise ValueError(f"cannot create the {what} {folder}: {exc.strerror or exc}") from None
    me = os.geteuid()
    owner = next((uid for uid in (link.st_uid, st.st_uid) if uid != me), None)
    if owner is not None:
        raise ValueError(
            f"the {what} {folder} is owned by another user (uid {owner}; you are uid {me}): a program there may not "
            f"be the one this package made; use a folder of your own (--cache-dir or ${CACHE_ENV})"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others")) if st.st_mode & bit)
        raise ValueError(
            f"the {what} {folder} can be written by {who} (mode {stat.S_IMODE(st.st_mode):04o}): a program there may "
            f"not be the one this package made; make it yours alone (chmod 700 {folder}) or use another"
        )
    return writable_dir(folder, what)


def cache_subdir(cache_dir: PathLike, name: str) -> Path:
    """``<cache_dir>/<name>``, both checked by :func:`private_dir` (created 0700 when missing): where a cache of
    files that hold code (AOTInductor packages, ExecuTorch programs, TensorRT engines) is kept."""
    return private_dir(private_dir(cache_dir) / name, f"{name} cache folder")


def default_cache_dir() -> Path:
    """``$ATTNZOO_CACHE``, else ``$XDG_CACHE_HOME/attnzoo``, else ``~/.cache/attnzoo``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnzoo"
