"""How long a fresh ``serve-demo`` takes to answer: started with an empty cache folder, timed to its "serving"
line, its first classification and its first segmentation (the best zoo models, a shipped example each).

    python -m attnzoo.serve.demo.coldstart --out results/serve-demo/coldstart.json

The result names the CPU and the load average before the start, since both decide the times.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gradio_client import Client, handle_file

from attnzoo import zoo
from attnzoo.fileio import write_json_report
from attnzoo.machine import cpu_info, cpu_summary, load_average
from attnzoo.serve import examples

__all__ = ["cold_start"]


def _wait_for_serving(proc: subprocess.Popen, start: float, timeout: float, log: list[str]) -> float:
    """Seconds until the process prints its ``serving ... on http://`` line; ``RuntimeError`` if it exits or
    ``timeout`` passes first. Every output line is kept in ``log``."""
    found = threading.Event()
    when: dict[str, float] = {}

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            log.append(line.rstrip())
            if "serving " in line and " on http://" in line and not found.is_set():
                when["t"] = time.perf_counter() - start
                found.set()

    threading.Thread(target=read, daemon=True).start()
    while not found.wait(0.2):
        if proc.poll() is not None or time.perf_counter() - start > timeout:
            raise RuntimeError("serve-demo did not start: " + " | ".join(log[-5:]))
    return when["t"]


def cold_start(port: int = 7899, timeout: float = 600.0) -> dict[str, Any]:
    """Start ``serve-demo`` on an empty cache and time it (see the module docstring)."""
    best = zoo.best_entries()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="attnzoo-coldstart-") as cache:
        env = {**os.environ, "ATTNZOO_CACHE": cache, "PYTHONUNBUFFERED": "1"}
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "attnzoo.serve.demo.cli", "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log: list[str] = []
        try:
            serving = _wait_for_serving(proc, start, timeout, log)
            while True:  # the line is printed just before the server binds its port
                try:
                    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
                    break
                except Exception:  # httpx's connection errors; retried until the timeout
                    if proc.poll() is not None or time.perf_counter() - start > timeout:
                        raise
                    time.sleep(0.1)
            label = client.predict(
                handle_file(examples.example_paths("cls")[0]), best["cls"]["variant"], api_name="/classify"
            )[0]["label"]
            first_cls = time.perf_counter() - start
            client.predict(
                handle_file(examples.example_paths("seg")[0]), best["seg"]["variant"], 0.6, api_name="/segment"
            )
            first_seg = time.perf_counter() - start
        finally:
            proc.terminate()
            proc.wait(30)
    cpu = cpu_info()
    return {
        "serving_s": round(serving, 2),
        "first_classify_s": round(first_cls, 2),
        "first_segment_s": round(first_seg, 2),
        "first_label": label,
        "models": {t: e["variant"] for t, e in best.items()},
        "cpu": cpu_summary(cpu),
        "usable_cores": cpu["usable_cores"],
        "load_average_before": load_before,
        "command": "python -m attnzoo.serve.demo.coldstart",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnzoo.serve.demo.coldstart", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    parser.add_argument("--port", type=int, default=7899)
    args = parser.parse_args(argv)
    write_json_report(cold_start(args.port), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
