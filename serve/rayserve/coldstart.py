"""How long a fresh ``serve-models`` takes to answer and to stop: started with an empty cache folder, timed to its
first ``200`` from ``POST /classify`` (a shipped example image), then stopped with a signal and timed until its
whole process tree is gone. ``startup`` is the command's own line on where its start went (Ray start, the models'
selection and checks, deploying the replicas); the rest of ``first_classify_s`` is the interpreter's start and
imports before it, and the first request.

    python -m attnzoo.serve.rayserve.coldstart --out results/serve-models/coldstart.json

The result names the CPU and the load average before the start, since both decide the times.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from attnzoo.fileio import write_json_report
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_info, cpu_summary, load_average
from attnzoo.serve import examples
from attnzoo.serve.rayserve.environment import free_port, port_problem

psutil = lazy_import("psutil")  # comes with ray (the [serving] extra), which the command timed needs anyway

__all__ = ["cold_start"]


def cold_start(sig: int = signal.SIGTERM, timeout: float = 600.0) -> dict[str, Any]:
    """Start ``serve-models`` on an empty cache, time its first answer and its stop (module docstring)."""
    image = Path(examples.example_paths("cls")[0]).read_bytes()
    port = free_port()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="attnzoo-coldstart-") as cache:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "attnzoo.serve.rayserve.cli", "--port", str(port), "--cache-dir", cache],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        lines: list[str] = []
        announced = threading.Event()  # its start-up line was printed (it can follow the first answer)
        reader = threading.Thread(target=_read, args=(proc.stdout, lines, announced), daemon=True)
        reader.start()
        try:
            while True:
                if proc.poll() is not None or time.perf_counter() - start > timeout:
                    raise RuntimeError(f"serve-models answered nothing (exit code {proc.poll()})")
                try:
                    r = httpx.post(f"http://127.0.0.1:{port}/classify", files={"file": image}, timeout=30)
                    if r.status_code == 200:
                        first = time.perf_counter() - start
                        label = r.json()["top"][0]["class"]
                        break
                except httpx.HTTPError:  # not listening yet
                    pass
                time.sleep(0.2)
            announced.wait(30)
            tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
            stop_start = time.perf_counter()
            proc.send_signal(sig)
            code = proc.wait(60)
            _, alive = psutil.wait_procs([p for p in map(_process, tree) if p is not None], timeout=10)
            stopped = time.perf_counter() - stop_start
            reader.join(10)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    cpu = cpu_info()
    startup = next((line.strip() for line in list(lines) if line.strip().startswith("started in ")), None)
    return {
        "first_classify_s": round(first, 2),
        "startup": startup,
        "first_label": label,
        "signal": signal.Signals(sig).name,
        "exit_code": code,
        "stop_s": round(stopped, 2),
        "processes_left": [p.pid for p in alive],
        "port_free": port_problem("127.0.0.1", port) is None,
        "cpu": cpu_summary(cpu),
        "usable_cores": cpu["usable_cores"],
        "load_average_before": load_before,
        "command": "python -m attnzoo.serve.rayserve.coldstart",
    }


def _read(stream, lines: list[str], announced: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if line.strip().startswith("started in "):
            announced.set()


def _process(pid: int):
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnzoo.serve.rayserve.coldstart", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--repeats", type=int, default=2, help="cold starts, alternating SIGTERM and SIGINT")
    args = parser.parse_args(argv)
    runs = [cold_start((signal.SIGTERM, signal.SIGINT)[i % 2]) for i in range(args.repeats)]
    write_json_report({"runs": runs}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
