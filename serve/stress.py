"""Three measured probes of the servers, each a figure a slow test asserts and ``results/serve-models/stress.json``
records: ``python -m attnzoo.serve.stress --models DIR --out results/serve-models/stress.json``.

- :func:`trickle`: clients that announce a 2 MB upload, send 300 KB (past what HAProxy used to buffer) and then
  10 B/s, reconnecting when cut, while ``/health`` and a small ``/classify`` are timed (serve-models).
- :func:`heavy_rounds`: rounds of 6 concurrent ``/segment`` with a 16-bit PNG, then ``/classify`` with a float32
  TIFF; the replica's resident memory at its peak and after each round, against its decode budget (serve-models).
- :func:`demo_fairness`: one small classification sent while 20 heavy classify / segment / compare requests are
  in the demo; how long the small one took.

The command starts ``serve-models`` and ``serve-demo`` on the zoo's standard Fashion-MNIST classifier and segmenter
(:func:`standard_models`), runs the three probes and writes their figures with this CPU and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

__all__ = [
    "probe_images",
    "standard_models",
    "trickle",
    "heavy_rounds",
    "demo_fairness",
    "serving",
    "demo_serving",
    "main",
]


def standard_models(folder: Path) -> Path:
    """The zoo's standard Fashion-MNIST classifier and segmenter, verified into ``folder`` (the shipped ONNX files
    where they are, else exported); returns ``folder``."""
    from attnzoo import zoo
    from attnzoo.export import adopt_verified, export_verified

    folder.mkdir(parents=True, exist_ok=True)
    for e in zoo.entries():
        if e["variant"] == "standard" and e["data"] == "fashion":
            model, config = zoo.load(e["variant"], e["task"], e["data"])
            out = folder / f"standard_{e['task']}.onnx"
            shipped = zoo.shipped_onnx(e)
            if shipped is not None:
                adopt_verified(model, shipped, out, config, batch_sizes=(1,), checkpoint_sha256=e["sha256"])
            else:
                export_verified(model, out, config, batch_sizes=(1,))
    return folder


def probe_images(side: int) -> dict[str, bytes]:
    """``png16``: a ``side`` x ``side`` 16-bit PNG (a garment-like block on black: a small file, a large decode);
    ``tiff``: a float32 TIFF of the same size (deflate, small on disk); ``small``: a 28-px 8-bit PNG."""
    px = np.zeros((side, side), np.uint16)
    px[side // 4 : 3 * side // 4, side // 3 : 2 * side // 3] = 50000
    out = {}
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, format="PNG")
    out["png16"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray((px / 65535.0).astype(np.float32)).save(buf, format="TIFF", compression="tiff_adobe_deflate")
    out["tiff"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(np.full((28, 28), 200, np.uint8)).save(buf, format="PNG")
    out["small"] = buf.getvalue()
    return out


# ------------------------------------------------------------------------------------------------ serve-models
def trickle(url: str, clients: int = 66, seconds: float = 8.0) -> dict[str, Any]:
    """``clients`` slow uploads (2 MB announced, 300 KB sent, then 10 B/s; a cut one reconnects) for ``seconds``,
    while ``/health`` and a small ``/classify`` are sent one after the other; their slowest answers."""
    import httpx  # the [serving] extra

    host, port = url.split("//")[1].rsplit(":", 1)
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 2000000\r\n\r\n"
    small = probe_images(28)["small"]

    async def slow_client(stop: asyncio.Event) -> int:
        connects = 0
        while not stop.is_set():
            connects += 1
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(head + bytes(300 * 1024))
                while not stop.is_set() and not reader.at_eof():
                    writer.write(b"x")
                    await writer.drain()
                    with contextlib.suppress(asyncio.TimeoutError):
                        if await asyncio.wait_for(reader.read(4096), 0.1) == b"":
                            break  # cut: reconnect
                writer.close()
        return connects

    async def run() -> dict[str, Any]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(slow_client(stop)) for _ in range(clients)]
        await asyncio.sleep(1.5)  # they are all past the first 300 KB
        health: list[float] = []
        classify: list[float] = []
        failed: list[str] = []
        end = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while time.monotonic() < end:
                for kind, send, took in (
                    ("health", lambda: http.get("/health"), health),
                    ("classify", lambda: http.post("/classify", content=small), classify),
                ):
                    start = time.perf_counter()
                    try:
                        r = await send()
                        if r.status_code != 200:
                            failed.append(f"{kind}: {r.status_code}")
                    except httpx.HTTPError as exc:
                        failed.append(f"{kind}: {type(exc).__name__}")
                    took.append(time.perf_counter() - start)
                await asyncio.sleep(0.2)
        stop.set()
        connects = await asyncio.gather(*tasks)
        return {
            "clients": clients,
            "seconds": seconds,
            "slow_connections": int(sum(connects)),
            "health_answers": len(health),
            "health_max_s": round(max(health), 3),
            "classify_answers": len(classify),
            "classify_max_s": round(max(classify), 3),
            "failed": failed,
        }

    return asyncio.run(run())


def _replica(pid: int):
    """The replica process of the ``serve-models`` process ``pid`` (Ray titles it ``ray::ServeReplica:...``)."""
    import psutil

    from attnzoo.serve.rayserve.environment import OWNER_ENV

    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get(OWNER_ENV, "").startswith(f"{pid}-") and "ServeReplica" in " ".join(p.cmdline()):
                return p
    raise RuntimeError(f"no replica of serve-models process {pid}")


def heavy_rounds(url: str, pid: int, rounds: int = 2, side: int = 6300, concurrent: int = 6) -> dict[str, Any]:
    """``rounds`` of ``concurrent`` ``/segment`` requests with a ``side``-px 16-bit PNG, then one ``/classify`` with a
    float32 TIFF of that size, against the ``serve-models`` process ``pid``: its replica's resident memory at the
    start, its peak over the start and what it kept after each round, with the replica's decode budget."""
    import httpx
    import psutil

    replica = _replica(pid)
    images = probe_images(side)
    base = replica.memory_info().rss
    peak, done = [base], threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                peak[0] = max(peak[0], replica.memory_info().rss)
            time.sleep(0.02)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    kept, codes = [], []
    post = lambda path, data: httpx.post(f"{url}{path}", content=data, timeout=600)  # noqa: E731
    try:
        with ThreadPoolExecutor(concurrent) as pool:
            for _ in range(rounds):
                codes += [
                    r.status_code for r in pool.map(lambda _: post("/segment", images["png16"]), range(concurrent))
                ]
                codes.append(post("/classify", images["tiff"]).status_code)
                time.sleep(0.5)
                kept.append(replica.memory_info().rss - base)
    finally:
        done.set()
        watcher.join()
    budget = httpx.get(f"{url}/stats", timeout=30).json()["decode_budget"]
    return {
        "side": side,
        "png16_bytes": len(images["png16"]),
        "tiff_bytes": len(images["tiff"]),
        "concurrent": concurrent,
        "rounds": rounds,
        "statuses": {str(c): codes.count(c) for c in sorted(set(codes))},
        "budget_bytes": budget["bytes"],
        "budget_peak_bytes": budget["peak"],
        "rss_start_bytes": base,
        "rss_peak_over_start_bytes": peak[0] - base,
        "rss_kept_over_start_bytes": kept,
    }


# ------------------------------------------------------------------------------------------------------- demo
def _demo_call(http, api: str, upload_path: str, *args: Any) -> str:
    """One call of the demo's API with an uploaded file; the event stream of its answer."""
    data = [{"path": upload_path, "meta": {"_type": "gradio.FileData"}}, *args]
    event = http.post(f"gradio_api/call/{api}", json={"data": data}).json()["event_id"]
    return http.get(f"gradio_api/call/{api}/{event}").text


def demo_fairness(url: str, heavy: int = 20, side: int = 6300, variant: tuple[str, str] = ("standard", "standard")):
    """``heavy`` classify / segment / compare requests with a ``side``-px float32 TIFF sent at once, then one
    small classification: how long the small one took, how many heavy ones were still pending then, and one heavy
    request's time alone for scale. The heavy ones are not waited for (stop the demo afterwards)."""
    import httpx

    images = probe_images(side)
    url = url.rstrip("/") + "/"
    with httpx.Client(base_url=url, timeout=900) as http:

        def upload(data: bytes, name: str) -> str:
            return http.post("gradio_api/upload", files={"files": (name, data, "image/tiff")}).json()[0]

        big, small = upload(images["tiff"], "heavy.tiff"), upload(images["small"], "small.png")
        start = time.perf_counter()
        _demo_call(http, "classify", big, variant[0])
        alone = time.perf_counter() - start
        calls = [("classify", (variant[0],)), ("segment", (variant[1], 0.5)), ("compare", ("cls",))]
        pool = ThreadPoolExecutor(heavy)
        try:
            jobs = [pool.submit(_demo_call, http, *calls[i % 3][:1], big, *calls[i % 3][1]) for i in range(heavy)]
            time.sleep(1.0)  # they are all in
            start = time.perf_counter()
            answer = _demo_call(http, "classify", small, variant[0])
            small_s = time.perf_counter() - start
            pending = sum(not j.done() for j in jobs)
        finally:  # the heavy ones are not waited for: their answers end with the client, the demo with its stop
            pool.shutdown(wait=False, cancel_futures=True)
    return {
        "heavy": heavy,
        "side": side,
        "heavy_alone_s": round(alone, 3),
        "small_s": round(small_s, 3),
        "heavy_pending_when_small_answered": pending,
        "small_answered": "event: complete" in answer,
    }


# --------------------------------------------------------------------------------------------------- servers
def _start(cmd: list[str], log: Path, ready: str, url: str, timeout: float = 300.0) -> subprocess.Popen:
    """``cmd`` started; returned once its log has a ``ready`` line and ``url`` answers."""
    import httpx

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if ready in log.read_text(errors="replace"):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=5).status_code == 200:
                    return proc
        time.sleep(0.2)
    _stop(proc)
    raise RuntimeError(f"{cmd[2]} did not start: " + " | ".join(log.read_text(errors="replace").splitlines()[-5:]))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def serving(models: Path, port: int, *args: str) -> Iterator[subprocess.Popen]:
    """``serve-models --models models --port port *args`` until the block ends (its log in a temporary folder)."""
    code = "import sys; from attnzoo.cli import serve_models; sys.exit(serve_models())"
    with tempfile.TemporaryDirectory(prefix="attnzoo-stress-") as tmp:
        cmd = [sys.executable, "-c", code, "--models", str(models), "--port", str(port), *args]
        proc = _start(cmd, Path(tmp) / "serve-models.log", "serving ", f"http://127.0.0.1:{port}/health")
        try:
            yield proc
        finally:
            _stop(proc)


@contextlib.contextmanager
def demo_serving(models: Path, port: int) -> Iterator[subprocess.Popen]:
    """``serve-demo --models models --port port`` until the block ends."""
    code = "import sys; from attnzoo.cli import serve_demo; sys.exit(serve_demo())"
    with tempfile.TemporaryDirectory(prefix="attnzoo-stress-") as tmp:
        cmd = [sys.executable, "-c", code, "--models", str(models), "--port", str(port), "--backend", "ort-cpu"]
        proc = _start(cmd, Path(tmp) / "serve-demo.log", "serving ", f"http://127.0.0.1:{port}/")
        try:
            yield proc
        finally:
            _stop(proc)


def main(argv: list[str] | None = None) -> int:
    from attnzoo.machine import cpu_info, cpu_summary, load_average
    from attnzoo.serve.network import free_port

    parser = argparse.ArgumentParser(prog="python -m attnzoo.serve.stress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--side", type=int, default=6300, help="side of the heavy images (default 6300: 39.7 MP)")
    parser.add_argument("--rounds", type=int, default=2, help="heavy rounds (default 2)")
    parser.add_argument("--heavy", type=int, default=20, help="heavy demo requests (default 20)")
    args = parser.parse_args(argv)
    for flag, value in (("--side", args.side), ("--rounds", args.rounds), ("--heavy", args.heavy)):
        if value < 1:
            print(f"error: {flag} must be at least 1, got {value}", file=sys.stderr)
            return 2
    out: dict[str, Any] = {"command": "python -m attnzoo.serve.stress " + " ".join(argv or sys.argv[1:])}
    out["cpu"] = cpu_summary(cpu_info())
    out["cpus"] = os.cpu_count()
    out["load_average_before"] = load_average()
    with tempfile.TemporaryDirectory(prefix="attnzoo-stress-models-") as tmp:
        models = standard_models(Path(tmp))
        port = free_port()
        with serving(models, port) as proc:
            url = f"http://127.0.0.1:{port}"
            out["trickle"] = trickle(url)
            out["heavy_rounds"] = heavy_rounds(url, proc.pid, rounds=args.rounds, side=args.side)
        port = free_port()
        with demo_serving(models, port):
            out["demo_fairness"] = demo_fairness(f"http://127.0.0.1:{port}", heavy=args.heavy, side=args.side)
    out["load_average_after"] = load_average()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".partial")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
