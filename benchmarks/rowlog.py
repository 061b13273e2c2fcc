"""The row log of a ``bench-latency`` run: ``rows.jsonl`` in ``--out``, one JSON object a line, each written with
one ``write`` and fsync'd as it finishes, so that a run killed by any signal, SIGKILL included, keeps every row it
finished and the same command run again measures only the rest.

Lines: a ``run`` line for every invocation (the settings and machine its numbers depend on, ``key``, and what it
asked for, ``asks``: its variants, backend/precision pairs and batch sizes), then ``row`` (a row and its overhead
entry), ``flops`` (a variant's count), ``group`` (a variant and batch finished: its head-to-head pairs and
profiles) and ``ceiling`` lines.

Reading it back is strict, because its rows become the results: every line must be one JSON object of a known
kind with the fields of its kind, of the right types and in range (no NaN, a row's percentiles in order, its
throughput its batch over its mean); a row, count or group must be one a ``run`` line before it asked for, with
that run's task and model; every ``run`` line has the first one's key. A line that is not is refused with the
file and line number, and nothing in the file is changed. The one exception is a last line without its newline:
the torn end of a write cut by a kill (or a full disk) -- it is dropped and cut off, and the run says so. Lines are
at most :data:`MAX_LINE_BYTES` (checked before a line is read whole), the file at most :data:`MAX_LOG_BYTES`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.fileio import parse_json
from attnzoo.limits import MAX_BATCH_SIZE
from attnzoo.runtime.backends import reference_backend

__all__ = [
    "LOG_NAME",
    "MAX_LINE_BYTES",
    "MAX_LOG_BYTES",
    "ROW_FIELDS",
    "ROW_STATUSES",
    "RowLog",
    "read_log",
    "run_asks",
]

#: The row log's file name in ``--out``.
LOG_NAME = "rows.jsonl"
#: Longest line read back: a row line is about 2 KB, a group line with ONNX Runtime profiles tens of KB.
MAX_LINE_BYTES = 1 << 20
#: Largest row log read back (the GPU plan's biggest model, every part run twice, is a few MB).
MAX_LOG_BYTES = 64 << 20
#: Statuses a row can have.
ROW_STATUSES = ("ok", "failed", "built", "skipped")

#: A variant, backend or precision name (the registry's names are all of this form).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")
#: The checks of a column in a row log: a number >= 0 or null, text or null (``None``: a check of its own).
_NUMBER, _TEXT = "number", "text"
#: Columns of a latency row (CSV and JSON ``results``), in order, each with what the row log checks it is.
_ROW_COLUMNS: dict[str, str | None] = {
    "variant": None,
    "task": None,
    "arch": None,
    "backend": None,
    "dtype": None,
    "batch": None,
    "status": None,
    "reason": None,
    "parity_error": _NUMBER,
    "parity_tol": _NUMBER,
    "iterations": None,
    "min_ms": _NUMBER,
    "median_ms": _NUMBER,
    "mean_ms": _NUMBER,
    "p90_ms": _NUMBER,
    "p95_ms": _NUMBER,
    "p99_ms": _NUMBER,
    "max_ms": _NUMBER,
    "cv": _NUMBER,
    "throughput_img_s": _NUMBER,
    "peak_mem_mb": _NUMBER,
    "mem_kind": _TEXT,
    "baseline": _TEXT,
    "speedup_vs_eager": _NUMBER,
    "speedup_vs_eager_fp32": _NUMBER,
    "speedup_pair_median": _NUMBER,
    "speedup_pair_q1": _NUMBER,
    "speedup_pair_q3": _NUMBER,
    "speedup_pairs": None,
    "cuda_graph": None,
    "build_s": _NUMBER,
    "gflop": _NUMBER,
    "achieved_gflops": _NUMBER,
    "ceiling_gflops": _NUMBER,
    "ceiling_fraction": _NUMBER,
    "roofline_us": _NUMBER,
    "roofline_fraction": _NUMBER,
    "device": _TEXT,
    "load_1min": _NUMBER,
}
ROW_FIELDS = tuple(_ROW_COLUMNS)
#: Row fields that are a number >= 0 or null.
_ROW_NUMBERS = tuple(name for name, kind in _ROW_COLUMNS.items() if kind == _NUMBER)
#: Row fields that are text or null.
_ROW_TEXTS = tuple(name for name, kind in _ROW_COLUMNS.items() if kind == _TEXT)
#: An ``ok`` row's latency statistics, in the order their values must be.
_ORDERED = ("min_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms")
_OVERHEAD_NUMBERS = ("ratio_median", "ratio_q1", "ratio_q3", "ratio_iqr", "variant_median_ms", "standard_median_ms")


class _Bad(ValueError):
    """Why one line of a row log is refused."""


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _field(obj: Any, key: str, ok: Callable[[Any], bool], need: str, where: str = "") -> Any:
    """``obj[key]`` when ``ok`` says it is valid, else :class:`_Bad` naming the field and what it must be."""
    if not isinstance(obj, dict):
        raise _Bad(f"{where or 'the line'} is {_show(obj)}, not a JSON object")
    if key not in obj:
        raise _Bad(f"no {where + '.' if where else ''}{key}")
    if not ok(obj[key]):
        raise _Bad(f"{where + '.' if where else ''}{key} is {_show(obj[key])}; it must be {need}")
    return obj[key]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _is_int(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _is_equal(want: Any) -> Callable[[Any], bool]:
    return lambda v: v == want


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and bool(_NAME.match(v))


def _is_text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 4000


def _opt(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


def _list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


_NUM = "a number >= 0"
_NAME_NEED = "a name of letters, digits and _ . + -"


def _check_asks(asks: Any) -> dict[str, Any]:
    _field(asks, "variants", lambda v: _list_of(_is_name)(v) and v, f"a list of names ({_NAME_NEED})", "asks")
    _field(
        asks,
        "combos",
        lambda v: _list_of(lambda c: _list_of(_is_name)(c) and len(c) == 2)(v) and v,
        "a list of [backend, precision] names",
        "asks",
    )
    _field(
        asks,
        "batch_sizes",
        lambda v: _list_of(_is_int(1, MAX_BATCH_SIZE))(v) and v,
        f"a list of batch sizes 1..{MAX_BATCH_SIZE}",
        "asks",
    )
    return asks


def _check_row(record: dict[str, Any], key: Mapping[str, Any], asked: _Asked) -> None:
    r = _field(record, "row", _is_dict, "a JSON object")
    for name in ("variant", "backend", "dtype"):
        _field(r, name, _is_name, _NAME_NEED, "row")
    batch = _field(r, "batch", _is_int(1, MAX_BATCH_SIZE), f"an integer 1..{MAX_BATCH_SIZE}", "row")
    for name in ("task", "arch"):  # the run's model
        _field(r, name, _is_equal(key.get(name)), f"{_show(key.get(name))}, the run's", "row")
    status = _field(r, "status", lambda v: v in ROW_STATUSES, " or ".join(ROW_STATUSES), "row")
    _field(r, "reason", _is_text, "text", "row")
    for name in _ROW_NUMBERS:
        _field(r, name, _opt(_is_num), f"{_NUM} or null", "row")
    for name in _ROW_TEXTS:
        _field(r, name, _opt(_is_text), "text or null", "row")
    for name in ("iterations", "speedup_pairs"):
        _field(r, name, _opt(_is_int(1, 10**9)), "a positive integer or null", "row")
    _field(r, "cuda_graph", _opt(lambda v: isinstance(v, bool)), "true, false or null", "row")
    if "info" in r:
        _field(r, "info", _is_dict, "a JSON object", "row")
    if not asked.has(r["variant"], r["backend"], r["dtype"], batch):
        raise _Bad(
            f"a row for {r['variant']} {r['backend']} {r['dtype']} batch {batch}, which no run line before it asked for"
        )
    if status == "ok":
        _check_timing(r)
    overhead = record.get("overhead")
    if overhead is not None:
        for name in ("variant", "backend", "dtype", "batch"):
            _field(overhead, name, _is_equal(r[name]), f"the row's {_show(r[name])}", "overhead")
        _field(overhead, "pairs", _is_int(2, 10**9), "an integer >= 2", "overhead")
        for name in _OVERHEAD_NUMBERS:
            _field(overhead, name, _is_num, _NUM, "overhead")


def _check_timing(row: dict[str, Any]) -> None:
    """An ``ok`` row's statistics, as :func:`attnzoo.benchmarks.stats.summarize` makes them: all there, in order."""
    _field(row, "iterations", _is_int(2, 10**9), "an integer >= 2 for an ok row", "row")
    for name in (*_ORDERED, "mean_ms", "cv", "throughput_img_s"):
        _field(row, name, _is_num, f"{_NUM} for an ok row", "row")
    values = [row[name] for name in _ORDERED]
    if values[0] <= 0 or values != sorted(values):
        raise _Bad(f"row's latencies are not 0 < {' <= '.join(_ORDERED)} ({', '.join(f'{v:g}' for v in values)})")
    if not row["min_ms"] <= row["mean_ms"] <= row["max_ms"]:
        raise _Bad(f"row.mean_ms {row['mean_ms']:g} is outside min_ms..max_ms")
    expected = row["batch"] * 1e3 / row["mean_ms"]
    if not math.isclose(row["throughput_img_s"], expected, rel_tol=1e-6):
        raise _Bad(f"row.throughput_img_s {row['throughput_img_s']:g} is not batch / mean_ms ({expected:g})")


def _check_ceiling(record: dict[str, Any]) -> None:
    c = _field(record, "ceiling", _is_dict, "a JSON object")
    _field(c, "threads", _is_int(1, 4096), "a thread count", "ceiling")
    _field(c, "shape", lambda v: _list_of(_is_int(1, 1 << 20))(v) and len(v) == 3, "[n, n, n]", "ceiling")
    fp32 = _field(c, "fp32", _is_dict, "a JSON object", "ceiling")
    _field(fp32, "gflops", _is_num, _NUM, "ceiling.fp32")
    _field(fp32, "library", _is_name, _NAME_NEED, "ceiling.fp32")
    libs = _field(fp32, "by_library", lambda v: _is_dict(v) and all(map(_is_name, v)), "a JSON object", "ceiling.fp32")
    for lib in libs.values():
        _field(lib, "median_gflops", _is_num, _NUM, "ceiling.fp32.by_library")
    int8 = _field(c, "int8", _is_dict, "a JSON object", "ceiling")
    if int8.get("status") == "measured":
        _field(int8, "gops", _is_num, _NUM, "ceiling.int8")
        for name in ("library", "isa"):
            _field(int8, name, _is_text, "text", "ceiling.int8")
    else:
        _field(int8, "reason", _is_text, "text", "ceiling.int8")
    if "fp32_end_gflops" in c:
        _field(c, "fp32_end_gflops", _opt(_is_num), f"{_NUM} or null", "ceiling")


def _check_flops(record: dict[str, Any], asked: _Asked) -> None:
    variant = _field(record, "variant", _is_name, _NAME_NEED)
    if variant not in asked.variants:
        raise _Bad(f"a FLOP count for {variant}, which no run line before it asked for")
    f = _field(record, "flops", _is_dict, "a JSON object")
    _field(f, "flops_per_image", _is_num, _NUM, "flops")
    _field(f, "counter", _is_text, "text", "flops")
    by_op = _field(f, "by_op", _is_dict, "a JSON object", "flops")
    if not all(isinstance(k, str) and _is_num(v) for k, v in by_op.items()):
        raise _Bad(f"flops.by_op must map op names to {_NUM}")


def _check_group(record: dict[str, Any], asked: _Asked) -> None:
    variant = _field(record, "variant", _is_name, _NAME_NEED)
    batch = _field(record, "batch", _is_int(1, MAX_BATCH_SIZE), f"an integer 1..{MAX_BATCH_SIZE}")
    if variant not in asked.variants or batch not in asked.batch_sizes:
        raise _Bad(f"a group for {variant} batch {batch}, which no run line before it asked for")
    for pair in _field(record, "pairs", _list_of(_is_dict), "a list of JSON objects"):
        for name, ok, need in (
            ("variant", lambda v: v == variant, "the group's"),
            ("batch", lambda v: v == batch, "the group's"),
            ("a", _is_name, _NAME_NEED),
            ("b", _is_name, _NAME_NEED),
            ("pairs", _is_int(2, 10**9), "an integer >= 2"),
        ):
            _field(pair, name, ok, need, "pairs[]")
        for name in ("ratio_median", "ratio_q1", "ratio_q3", "ratio_iqr", "a_median_ms", "b_median_ms"):
            _field(pair, name, _is_num, _NUM, "pairs[]")
        if pair["ratio_median"] <= 0:
            raise _Bad("pairs[].ratio_median must be > 0")
    for profile in _field(record, "profiles", _list_of(_is_dict), "a list of JSON objects"):
        _field(profile, "variant", lambda v: v == variant, "the group's", "profiles[]")
        _field(profile, "batch", lambda v: v == batch, "the group's", "profiles[]")
        for side in ("naive", "tuned"):
            p = _field(profile, side, _is_dict, "a JSON object", "profiles[]")
            _field(p, "ms_per_run", _is_num, _NUM, f"profiles[].{side}")
            _field(
                p,
                "ops",
                lambda v: _is_dict(v) and all(map(_is_num, v.values())),
                f"a JSON object of {_NUM}",
                f"profiles[].{side}",
            )
            _field(
                p,
                "top_nodes",
                _list_of(
                    lambda n: (
                        isinstance(n, list) and len(n) == 3 and _is_text(n[0]) and _is_text(n[1]) and _is_num(n[2])
                    )
                ),
                "a list of [node, op, ms]",
                f"profiles[].{side}",
            )
    for name in ("head_to_head_errors", "profile_errors"):
        if name in record:
            _field(record, name, _list_of(_is_text), "a list of text")


class _Asked:
    """What the run lines read so far asked for (rows, counts and groups must be among it)."""

    def __init__(self) -> None:
        self.variants: set[str] = set()
        self.combos: set[tuple[str, str]] = set()
        self.batch_sizes: set[int] = set()
        self.runs: list[tuple[set[str], set[tuple[str, str]], set[int]]] = []

    def add(self, asks: Mapping[str, Any]) -> None:
        run = (set(asks["variants"]), {tuple(c) for c in asks["combos"]}, set(asks["batch_sizes"]))
        self.runs.append(run)
        self.variants |= run[0]
        self.combos |= run[1]
        self.batch_sizes |= run[2]

    def has(self, variant: str, backend: str, dtype: str, batch: int) -> bool:
        return any(variant in v and (backend, dtype) in c and batch in b for v, c, b in self.runs)


def _check(record: Any, first: Mapping[str, Any] | None, asked: _Asked) -> None:
    """Raise :class:`_Bad` unless ``record`` is a valid line after a first run line ``first``."""
    kind = _field(
        record, "kind", lambda v: v in ("run", "row", "flops", "group", "ceiling"), "run, row, flops, group or ceiling"
    )
    if kind == "run":
        key = _field(record, "key", _is_dict, "a JSON object")
        if first is not None and key != first["key"]:
            raise _Bad("a run line with another key than the first one's (other settings)")
        asked.add(_check_asks(_field(record, "asks", _is_dict, "a JSON object")))
        return
    if first is None:
        raise _Bad("the first line must be a run line")
    if kind == "row":
        _check_row(record, first["key"], asked)
    elif kind == "flops":
        _check_flops(record, asked)
    elif kind == "group":
        _check_group(record, asked)
    else:
        _check_ceiling(record)


def read_log(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of the row log at ``path``, and the length in bytes of a torn last line (0 if none) that was
    left out.

    Raises:
        ValueError: one line naming the file and line: the file over :data:`MAX_LOG_BYTES`, a line over
            :data:`MAX_LINE_BYTES`, not JSON, not a valid record, or not asked for by a run line before it.
    """
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_LOG_BYTES:
        raise ValueError(f"{path} is {size:,} bytes, over the {MAX_LOG_BYTES:,} a row log can be; use another --out")
    records: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    asked = _Asked()
    torn = 0
    with open(path, "rb") as f:
        number = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)  # bounded: a longer line is refused before it is read whole
            if not line:
                break
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(
                    f"{path} line {number}: longer than {MAX_LINE_BYTES:,} bytes, not a row log line; "
                    f"nothing was changed: remove it, or delete {path.name} to measure from the start"
                )
            if not line.endswith(b"\n"):  # the end of the file: a write torn by a kill
                torn = len(line)
                break
            try:
                record = parse_json(line)
                _check(record, first, asked)
            except ValueError as exc:
                why = str(exc) if isinstance(exc, _Bad) else f"not JSON ({exc})"
            else:
                first = first or record
                records.append(record)
                continue
            raise ValueError(
                f"{path} line {number}: {why}; nothing was changed: correct or remove that line, or "
                f"delete {path.name} to measure from the start"
            )
    return records, torn


class RowLog:
    """The run's rows on disk as they are finished (the module docstring says what each line holds).

    Reopened with the same key, the records are read back (:func:`read_log`; a torn last line is dropped and cut
    off, ``torn`` says how many bytes) and a run line with ``key`` and ``asks`` is appended; with another key, or a
    line that is not valid, it is refused and the file is left as it was.
    """

    def __init__(self, path: Path, key: Mapping[str, Any], asks: Mapping[str, Any], header: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.records: list[dict[str, Any]] = []
        self.torn = 0
        if self.path.is_file():
            self.records, self.torn = read_log(self.path)
            first = self.records[0] if self.records else {}
            if first and first["key"] != dict(key):
                old = first["key"]
                differ = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
                raise ValueError(
                    f"{self.path} holds rows measured with other settings (differing: "
                    f"{', '.join(differ)}); use another --out, or delete {self.path.name} to measure "
                    "from the start"
                )
            if self.torn:
                os.truncate(self.path, self.path.stat().st_size - self.torn)
        self.earlier = len(self.records)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.append({"kind": "run", "key": dict(key), "asks": _check_asks(dict(asks)), **header})

    def append(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one line and fsync it (a kill leaves it whole or not there)."""
        data = (json.dumps(record, allow_nan=False, default=str) + "\n").encode()
        if os.write(self._fd, data) != len(data):  # out of disk: the torn line is dropped when read back
            raise OSError(f"could not append to {self.path} (disk full?)")
        os.fsync(self._fd)
        self.records.append(dict(record))

    def close(self) -> None:
        os.close(self._fd)

    def of(self, kind: str) -> list[dict[str, Any]]:
        """Every record of ``kind``, in order."""
        return [r for r in self.records if r.get("kind") == kind]


def run_asks(
    variants: Sequence[str], backends: Sequence[str], dtypes: Sequence[str], batch_sizes: Sequence[int]
) -> dict[str, Any]:
    """A run's ``asks``: ``standard`` first among its variants (the overhead baseline) and eager fp32 first among
    its backend/precision pairs (the parity reference and every row's A/B baseline always run)."""
    combos = [[b, d] for b in backends for d in dtypes]
    reference = [reference_backend(), "fp32"]
    if reference not in combos:
        combos.insert(0, reference)
    return {
        "variants": list(dict.fromkeys(["standard", *variants])),
        "combos": combos,
        "batch_sizes": list(batch_sizes),
    }
