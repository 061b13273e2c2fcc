"""The Gradio demo: launched on a free port with a small folder of exported models, called through
gradio_client (every endpoint, images of every mode, bad files) and, when Debian's chromium is installed,
through a real browser with every non-local request aborted."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

import attnzoo.serve  # noqa: F401  (offline environment first)
from attnzoo.data.fashion import FASHION_CLASSES, FASHION_SEG_CLASSES
from attnzoo.export import zoo_cache
from attnzoo.preprocess import fit_size, input_style_of
from attnzoo.serve import examples, predict, zoo_models
from attnzoo.serve import loading as backends
from attnzoo.serve.demo.app import DISPLAY_MAX_SIDE
from attnzoo.serve.demo.cli import main as cli_main
from attnzoo.serve.demo.screenshot import CHROMIUM
from attnzoo.serve.loading import ServedModel, load_models
from attnzoo.serve.served import SLIDING_BATCH
from attnzoo.training.zoo import RECIPES

ROOT = Path(__file__).resolve().parents[2]
CLASSES = list(FASHION_CLASSES)
SERVED = [("standard", "cls"), ("belief2", "cls"), ("standard", "seg")]


def _make_model(variant: str, task: str):
    """The zoo's Fashion-MNIST model when the zoo has it, else a random-init micro-conv model with its classes."""
    import torch

    from attnzoo import zoo
    from attnzoo.models import create_model

    if variant in zoo.available(task, "fashion"):
        return zoo.load(variant, task, "fashion")
    names = FASHION_CLASSES if task == "cls" else FASHION_SEG_CLASSES
    torch.manual_seed(0)
    model = create_model(variant, task=task, arch="micro-conv", num_classes=len(names)).eval()
    return model, {**model.attnzoo_config, "class_names": names, "mean": [0.5] * 3, "std": [0.5] * 3}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    """Two classifiers and one segmenter exported to ONNX, plus the checkpoints (pytorch backend)."""
    from attnzoo.export import export_verified
    from attnzoo.models.checkpoint import save_checkpoint

    folder = tmp_path_factory.mktemp("models")
    for variant, task in SERVED:
        model, config = _make_model(variant, task)
        save_checkpoint(
            model,
            folder / f"{variant}_{task}.safetensors",
            class_names=config["class_names"],
            mean=config["mean"],
            std=config["std"],
            input_style=input_style_of(config),
        )
        export_verified(model, folder / f"{variant}_{task}.onnx", config, batch_sizes=(1,))
    return folder


ACTIVE = {"now": 0, "max": 0, "delay": 0.0}


@pytest.fixture(scope="module")
def served(models_dir):
    """The served models, each wrapped to count its calls and how many model calls run at once."""
    models = load_models(models_dir)
    for m in models:
        m.calls = 0

        def counted(x, _run=m.run, _m=m):
            _m.calls += 1
            ACTIVE["now"] += 1
            ACTIVE["max"] = max(ACTIVE["max"], ACTIVE["now"])
            try:
                time.sleep(ACTIVE["delay"])
                return _run(x)
            finally:
                ACTIVE["now"] -= 1

        m.run = counted
    return models


@pytest.fixture(scope="module")
def server(served):
    """The demo on a free port of 127.0.0.1 (in this process); yields its URL."""
    from attnzoo.serve.demo.app import build_demo, launch
    from attnzoo.serve.network import free_port

    demo = build_demo(served, source="test models")
    port = free_port()
    launch(demo, "127.0.0.1", port, block=False)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def client(server) -> Client:
    return Client(server, verbose=False)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict:
    """Files of every kind the demo must take (and some it must refuse)."""
    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    files = {"example": Path(examples.example_paths("seg")[0])}
    Image.fromarray(rgb).save(d / "rgb.png")
    Image.fromarray(np.dstack([rgb, rng.integers(0, 256, (40, 56, 1), dtype=np.uint8)])).save(d / "rgba.png")
    Image.fromarray(rgb[..., 0]).save(d / "gray.png")
    Image.fromarray((rng.integers(0, 65536, (33, 21))).astype(np.uint16)).save(d / "gray16.png")
    Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE).save(d / "palette.png")
    Image.new("RGB", (1, 1), (200, 30, 30)).save(d / "one.png")
    yy, xx = np.mgrid[0:1500, 0:2400]
    Image.fromarray(np.dstack([xx % 256, yy % 256, (xx + yy) % 256]).astype(np.uint8)).save(d / "large.jpg")
    for name in ("rgb", "rgba", "gray", "gray16", "palette", "one", "large"):
        files[name] = next(d.glob(f"{name}.*"))
    (d / "text.png").write_text("this is not an image\n")
    (d / "truncated.png").write_bytes((d / "rgb.png").read_bytes()[:200])
    files["bad"] = [d / "text.png", d / "truncated.png"]
    return files


GOOD = ("example", "rgb", "rgba", "gray", "gray16", "palette", "one", "large")


# ------------------------------------------------------------------------------------------- client tests
@pytest.mark.parametrize("name", GOOD)
def test_classify_endpoint(client, images, name):
    label, latency, _, seen = client.predict(handle_file(images[name]), "standard", api_name="/classify")
    seen = np.asarray(Image.open(seen))
    assert seen.shape == (28, 28, 3) and (seen == seen[..., :1]).all()  # gray, at the model's input size
    conf = [c["confidence"] for c in label["confidences"]]
    assert [c["label"] for c in label["confidences"]][0] == label["label"]
    assert len(conf) == 5 and {c["label"] for c in label["confidences"]} <= set(CLASSES)
    assert conf == sorted(conf, reverse=True) and all(0 <= p <= 1 for p in conf)
    # the top 5 of K probabilities hold at least 5/K of the mass, at most all of it
    assert 5 / len(CLASSES) - 1e-6 <= sum(conf) <= 1 + 1e-6
    assert isinstance(latency, float) and 0 < latency < 60_000


def test_classify_reports_true_class_of_an_example(client):
    path = examples.example_paths("cls")[0]
    entry = examples.find_example(Image.open(path))
    _, _, note, _ = client.predict(handle_file(path), "belief2", api_name="/classify")
    assert entry["label"] in note


def test_every_answer_says_what_the_model_knows(client, images):
    """A photo of something else must not come back as a bare confident label."""
    _, _, note, _ = client.predict(handle_file(images["rgb"]), "standard", api_name="/classify")
    assert "knows only 10 classes" in note and all(name in note for name in CLASSES)
    assert "says nothing about such an image" in note
    assert "This image has a busy background" in note  # random pixels: no plain background to convert away


def test_a_garment_on_white_is_converted_without_a_warning(client, tmp_path):
    """A Fashion-MNIST garment as a photo would show it (dark on white, small, off-centre): no warning, and
    the model sees it light on black, filling its frame."""
    from attnzoo.data.fashion import fashion_arrays

    gray, _ = fashion_arrays("test", root=ROOT / "tests" / "data" / "fashion-mnist")  # the committed subset
    canvas = np.full((96, 96), 255, np.uint8)
    canvas[10:50, 40:80] = np.asarray(Image.fromarray(255 - gray[0]).resize((40, 40), Image.BILINEAR))
    Image.fromarray(canvas).save(tmp_path / "on_white.png")
    _, _, note, seen = client.predict(handle_file(tmp_path / "on_white.png"), "standard", api_name="/classify")
    seen = np.asarray(Image.open(seen))[..., 0]
    assert "Converted as the training images look" in note and "This image has a busy background" not in note
    assert seen[0].max() < 40 and seen[12:16, 12:16].mean() > 60  # black border, light garment in the middle


@pytest.mark.parametrize("name", GOOD)
def test_segment_endpoint(client, images, name):
    shown, legend, latency, _ = client.predict(handle_file(images[name]), "standard", 0.6, api_name="/segment")
    with Image.open(images[name]) as src:
        w, h = src.size
    if max(w, h) > DISPLAY_MAX_SIDE:  # shown downscaled past 2048 px, aspect kept
        h, w = fit_size((h, w), DISPLAY_MAX_SIDE)
    assert Image.open(shown).size == (w, h)  # the overlay has the image's size
    rows = legend["data"]
    assert legend["headers"] == ["colour", "class", "pixels %", "IoU"]
    assert {r[1] for r in rows} <= set(FASHION_SEG_CLASSES)
    assert sum(r[2] for r in rows) == pytest.approx(100, abs=0.1)
    assert isinstance(latency, float) and latency > 0


def _true_iou(model, example: Path) -> dict:
    """{class name: IoU} of ``model``'s mask of a shipped segmentation example against its true mask file."""
    mask, _ = predict.segment(model, Image.open(example))
    truth = np.asarray(Image.open(example.with_name(example.stem + "_mask.png")))
    out = {}
    for c, name in enumerate(model.class_names):
        p, t = mask == c, truth == c
        if (p | t).any():
            out[name] = float((p & t).sum()) / float((p | t).sum())
    return out


def test_segment_example_shows_iou(client, served, images):
    _, legend, _, note = client.predict(handle_file(images["example"]), "standard", 0.6, api_name="/segment")
    want = _true_iou(next(m for m in served if m.task == "seg" and m.name == "standard"), images["example"])
    assert {r[1]: r[3] for r in legend["data"]} == {c: round(v, 3) for c, v in want.items()}
    assert f"mean IoU over its classes **{np.mean(list(want.values())):.3f}**" in note, note


def test_opacity_slider_redraws_without_the_model(client, served, images):
    seg = next(m for m in served if m.task == "seg")
    shown, *_ = client.predict(handle_file(images["rgb"]), "standard", 0.6, api_name="/segment")
    calls = seg.calls
    clear = client.predict(0.0, api_name="/overlay")
    solid = client.predict(1.0, api_name="/overlay")
    assert seg.calls == calls  # the slider did not run the model
    original = np.asarray(Image.open(images["rgb"]).convert("RGB"))
    np.testing.assert_array_equal(np.asarray(Image.open(clear).convert("RGB")), original)
    assert not np.array_equal(np.asarray(Image.open(solid).convert("RGB")), original)
    assert not np.array_equal(np.asarray(Image.open(shown).convert("RGB")), original)


@pytest.mark.parametrize("task", ["cls", "seg"])
def test_compare_endpoint(client, served, images, task):
    path = examples.example_paths(task)[0]
    gallery, table = client.predict(handle_file(path), task, api_name="/compare")
    names = [m.name for m in served if m.task == task]
    assert len(gallery) == len(names) == len(table["data"])
    for item, row, name in zip(gallery, table["data"], names, strict=False):
        assert item["caption"].startswith(f"{name}: ") and item["caption"].endswith(" ms")
        assert row[0] == name and row[3] > 0 and 0 < row[2] <= 1
        model = next(m for m in served if m.task == task and m.name == name)  # the example's truth is known
        if task == "cls":
            top = next(iter(predict.classify(model, Image.open(path), k=1)[0]))
            assert row[4] == float(top == examples.find_example(Image.open(path))["label"]), (row, top)
        else:
            assert row[4] == round(float(np.mean(list(_true_iou(model, Path(path)).values()))), 4), row
        assert Image.open(item["image"]).size[0] > 0
    _, table = client.predict(handle_file(images["rgb"]), task, api_name="/compare")
    assert [row[4] for row in table["data"]] == [None] * len(names)


@pytest.mark.parametrize("which", [0, 1])
def test_unreadable_file_is_a_clear_error(client, images, which):
    for api, args in (("/classify", ("standard",)), ("/segment", ("standard", 0.5)), ("/compare", ("cls",))):
        with pytest.raises(AppError, match="cannot read image"):
            client.predict(handle_file(images["bad"][which]), *args, api_name=api)


def _raw_call(server: str, api: str, data: list, timeout: float = 10.0) -> str:
    """POST a payload as an attacker would (no ``meta``, any ``path``) to ``/gradio_api/call/<api>`` and return
    the event stream of its answer, or ``refused <status>: <body>`` when the call itself was refused."""
    import httpx

    with httpx.Client(base_url=server, timeout=timeout) as http:
        r = http.post(f"gradio_api/call/{api}", json={"data": data})
        if r.status_code != 200:
            return f"refused {r.status_code}: {r.text}"
        return http.get(f"gradio_api/call/{api}/{r.json()['event_id']}").text


@pytest.fixture(scope="module")
def hostile_paths(tmp_path_factory) -> dict:
    """Files outside the demo's uploads: a secret image, a FIFO nobody writes, a folder, a device, /etc/passwd,
    and a link inside Gradio's upload folder that points at the secret."""
    from gradio.utils import get_upload_folder

    d = tmp_path_factory.mktemp("outside")
    secret = d / "secret.png"
    Image.fromarray(np.full((28, 28, 3), 123, np.uint8)).save(secret)
    fifo = d / "fifo.png"
    os.mkfifo(fifo)
    inside = Path(get_upload_folder()) / "attnzoo-test-link"
    inside.mkdir(parents=True, exist_ok=True)
    link = inside / "secret.png"
    link.unlink(missing_ok=True)
    link.symlink_to(secret)
    yield {
        "secret": secret,
        "fifo": fifo,
        "folder": d,
        "device": Path("/dev/zero"),
        "passwd": Path("/etc/passwd"),
        "link": link,
    }
    shutil.rmtree(inside, ignore_errors=True)


HOSTILE_CALLS = [("classify", ["standard"]), ("segment", ["standard", 0.5]), ("compare", ["cls"])]


@pytest.mark.parametrize("api,args", HOSTILE_CALLS, ids=[c[0] for c in HOSTILE_CALLS])
@pytest.mark.parametrize("kind", ["secret", "fifo", "folder", "device", "passwd", "link"])
def test_the_demo_reads_only_its_uploads(server, hostile_paths, api, args, kind):
    """A payload naming any file but an upload gets one line at once; nothing of the file comes back."""
    start = time.perf_counter()
    answer = _raw_call(server, api, [{"path": str(hostile_paths[kind])}, *args])
    assert time.perf_counter() - start < 5.0
    assert answer.startswith("refused 400: ") and "the demo reads only files uploaded to it" in answer, answer
    assert "overlay" not in answer and "confidences" not in answer


def test_a_folder_inside_the_uploads_is_one_clear_error(server, tmp_path):
    """A payload naming a folder in Gradio's upload folder (where the path check lets it through) gets one line,
    not an internal error."""
    from gradio.utils import get_upload_folder

    inside = Path(get_upload_folder()) / "attnzoo-test-folder"
    inside.mkdir(parents=True, exist_ok=True)
    try:
        for api, args in HOSTILE_CALLS:
            answer = _raw_call(server, api, [{"path": str(inside)}, *args])
            assert "event: error" in answer and "not a regular file" in answer, answer
            assert "internal error" not in answer and "IsADirectoryError" not in answer
    finally:
        inside.rmdir()


def test_request_bodies_are_bounded_before_they_are_read_and_never_logged(server, capfd):
    """An API call with a 2 MiB body (a client's "path" of 2 MiB) gets 413 before the demo reads it, whether its
    size is declared or it streams in without one; an upload over the file cap is refused from its
    Content-Length; nothing of the body reaches the log."""
    import httpx

    from attnzoo.serve.demo.app import MAX_FILE_SIZE

    MAX_API_BODY = 2**20  # docs/demo.md: 1 MiB for anything but an upload
    mark = "attnzoo-body-mark-"
    payload = ('{"data": [{"path": "' + mark * (2 * MAX_API_BODY // len(mark)) + '"}, "standard"]}').encode()

    def chunks():
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    with httpx.Client(base_url=server, timeout=30) as http:
        declared = http.post("gradio_api/call/classify", content=payload, headers={"Content-Type": "application/json"})
        streamed = http.post("gradio_api/call/classify", content=chunks(), headers={"Content-Type": "application/json"})
    for r in (declared, streamed):
        assert r.status_code == 413 and r.json() == {
            "error": f"the request body is {f'{len(payload):,} bytes, ' if r is declared else ''}over the "
            f"{MAX_API_BODY:,}-byte limit"
        }, (r.status_code, r.text[:300])
    host, port = server.split("//")[1].rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:  # an upload that says it is too large
        conn.sendall(
            f"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
            f"boundary=x\r\nContent-Length: {2 * MAX_FILE_SIZE}\r\n\r\n".encode()
            + b"x" * 1024
        )
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413") and b"over the" in answer, answer[:300]
    # under the limit, a path of 512 KiB: refused in one short line that quotes 80 characters of it at most
    answer = _raw_call(server, "classify", [{"path": "/x/" + mark * (MAX_API_BODY // 2 // len(mark))}, "standard"])
    assert answer.startswith("refused 400: ") and len(answer) < 1000, answer[:300]
    out, err = capfd.readouterr()
    assert (out + err).count(mark) <= 80 // len(mark), (out + err)[:500]


def test_a_url_payload_is_refused_in_one_line_and_never_fetched(server, capfd):
    """The demo works offline: a payload whose ``path`` (or ``url``) is a URL is refused before Gradio sees it
    (Gradio would download it into its cache), and a refused path logs nothing, no traceback."""
    import http.server
    import threading

    hits = []

    class Count(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Count)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{listener.server_port}/cat.png"
        capfd.readouterr()
        for api, args in HOSTILE_CALLS:
            for payload in ({"path": url}, {"path": url, "url": url, "meta": {"_type": "gradio.FileData"}}):
                answer = _raw_call(server, api, [payload, *args])
                assert answer.startswith("refused 400: ") and "works offline" in answer, answer
            answer = _raw_call(server, api, [{"path": "/etc/passwd"}, *args])
            assert answer.startswith("refused 400: "), answer
        time.sleep(0.5)
        assert hits == []
        out, err = capfd.readouterr()
        assert "Traceback" not in out + err, (out + err)[-2000:]
    finally:
        listener.shutdown()


def test_the_upload_route_has_a_quota_per_client_and_in_all():
    """Uploads are charged per client from their Content-Length (429 with Retry-After past its files or bytes,
    503 past the total, 411 without a size) and forgotten after the keep time."""
    from attnzoo.serve.demo.app import UploadQuota

    written = []

    async def app(scope, receive, send):
        written.append(scope["client"][0])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'["/up/a.png", "/up/b.png"]'})

    quota = UploadQuota(app, files=2, per_client=10 * 2**20, total=25 * 2**20, keep_s=0.5)

    def upload(client: str, size: int | None) -> tuple[int, dict]:
        sent = []

        async def send(message):
            sent.append(message)

        headers = [(b"content-length", str(size).encode())] if size is not None else []
        scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "headers": headers}
        asyncio.run(quota({**scope, "client": (client, 1)}, None, send))
        return sent[0]["status"], dict(sent[0]["headers"])

    assert upload("a", 2**20)[0] == 200  # 2 files, 1 MiB
    status, headers = upload("a", 2**20)  # its answer listed 2 files: a third is over 2
    assert status == 429 and int(headers[b"retry-after"]) >= 1
    assert upload("b", 9 * 2**20)[0] == 200 and upload("b", 2 * 2**20)[0] == 429  # 11 MiB over 10
    assert upload("c", 9 * 2**20)[0] == 200 and upload("d", 9 * 2**20)[0] == 503  # 28 MiB over 25 in all
    assert upload("e", None)[0] == 411
    time.sleep(0.6)
    assert upload("a", 2**20)[0] == 200 and upload("d", 9 * 2**20)[0] == 200  # forgotten after the keep time
    assert written == ["a", "b", "c", "a", "d"]


def test_a_long_file_name_is_not_repeated_whole():
    from attnzoo.serve.demo.app import _read_upload

    with pytest.raises(ValueError) as info:
        _read_upload({"path": "/nowhere/" + "a" * 500_000 + ".png"})
    assert len(str(info.value)) < 300 and "the demo reads only files uploaded to it" in str(info.value)


def test_cli_warns_before_listening_beyond_loopback(monkeypatch, capsys):
    """serve-demo --host 0.0.0.0 prints serve-models' warning (the same words) before anything loads."""
    from attnzoo.serve.demo import cli

    def stop_here(*args, **kwargs):
        raise ValueError("stopped before loading")

    monkeypatch.setattr(cli, "load_models", stop_here)
    with pytest.raises(SystemExit, match="stopped before loading"):
        cli_main(["--host", "0.0.0.0", "--port", "7999"])
    assert (
        "warning: --host 0.0.0.0: port 7999 answers whoever can reach this machine there (no authentication, no TLS)"
    ) in capsys.readouterr().err.splitlines()
    with pytest.raises(SystemExit, match="stopped before loading"):
        cli_main(["--host", "127.0.0.1"])
    assert "warning" not in capsys.readouterr().err


def test_a_fifo_payload_does_not_hold_the_model_slot(server, hostile_paths, images):
    """A FIFO path in one request must not hold the single model slot until someone writes to it."""
    import threading

    stuck = threading.Thread(
        target=_raw_call, args=(server, "segment", [{"path": str(hostile_paths["fifo"])}, "standard", 0.5])
    )
    stuck.start()
    start = time.perf_counter()
    label, *_ = Client(server, verbose=False).predict(handle_file(images["rgb"]), "standard", api_name="/classify")
    assert label["confidences"] and time.perf_counter() - start < 10.0
    stuck.join(timeout=10)
    assert not stuck.is_alive()


def test_unknown_variant_lists_the_valid_ones(client, images):
    with pytest.raises(AppError, match="unknown variant 'nope'; valid: standard, belief2"):
        client.predict(handle_file(images["rgb"]), "nope", api_name="/classify")


def test_a_long_variant_name_comes_back_cut_in_the_error_event(client, images):
    """A 60 KB model name is quoted in the error event as 80 characters at most, as serve-models quotes it."""
    for api, value in (("/classify", "v" * 60_000), ("/compare", "t" * 60_000)):
        with pytest.raises(AppError) as info:
            client.predict(handle_file(images["rgb"]), value, api_name=api)
        message = str(info.value)
        assert len(message) < 300 and value[:77] + "..." in message and value[:78] not in message, message[:300]


def test_the_model_picker_shows_the_picked_models_card(client):
    """Each dropdown has the picked model's card under it; a model without one (these are served from a folder, not
    as the zoo's) says so, and a name the dropdown does not list is refused (by Gradio, before the handler)."""
    assert client.predict("belief2", api_name="/cls_card").startswith("No model card ships with belief2")
    with pytest.raises(AppError, match=r"nope is not in the list of choices: \['standard', 'belief2'\]"):
        client.predict("nope", api_name="/cls_card")


def test_a_zoo_model_carries_its_timm_name_and_its_packaged_card():
    from attnzoo.serve.demo.app import model_card

    def served(variant: str, task: str, timm_name: str = "") -> ServedModel:
        names = CLASSES if task == "cls" else list(FASHION_SEG_CLASSES)
        return ServedModel(
            variant, variant, task, names, (28, 28), (0.5,) * 3, (0.5,) * 3, True, run=np.asarray, timm_name=timm_name
        )

    scored = zoo_models._with_scores([served("belief2", "cls"), served("belief", "seg")], backends.zoo_rows("fashion"))
    assert [m.timm_name for m in scored] == [
        "vit_micro_conv_belief2.fashion_mnist",
        "segmenter_vit_micro_conv_belief.fashion_mnist",
    ]
    card = model_card(scored[0])
    assert card.startswith("# vit_micro_conv_belief2.fashion_mnist\n") and "model-index" not in card
    assert "## Deployability" in card and "89.41" in card
    assert (
        model_card(served("cosine", "cls"))
        == "No model card ships with cosine: the zoo's Fashion-MNIST models carry one."
    )


def test_upload_size_is_capped(client, tmp_path):
    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG" + os.urandom(11 * 1024 * 1024))
    with pytest.raises(Exception, match="exceeds the maximum file size"):
        client.predict(handle_file(big), "standard", api_name="/classify")


def test_classify_drawing(client, tmp_path):
    canvas = np.zeros((64, 64, 4), np.uint8)
    canvas[16:48, 16:48] = (0, 0, 0, 255)  # a black square drawn on a transparent canvas
    Image.fromarray(canvas).save(tmp_path / "drawing.png")
    value = {"background": None, "layers": [], "composite": handle_file(tmp_path / "drawing.png")}
    label, latency, _, _ = client.predict(value, "standard", api_name="/classify_drawing")
    assert len(label["confidences"]) == 5 and latency > 0
    Image.fromarray(np.zeros((64, 64, 4), np.uint8)).save(tmp_path / "empty.png")
    value["composite"] = handle_file(tmp_path / "empty.png")
    with pytest.raises(AppError, match="nothing drawn yet"):
        client.predict(value, "standard", api_name="/classify_drawing")


def test_demo_without_classifiers(served, images):
    from attnzoo.serve.demo.app import build_demo, launch

    demo = build_demo([m for m in served if m.task == "seg"], source="segmenters only")
    _, url, _ = launch(demo, "127.0.0.1", None, block=False)
    try:
        only_seg = Client(url, verbose=False)
        with pytest.raises(AppError, match="no classification models are served"):
            only_seg.predict(handle_file(images["rgb"]), None, api_name="/classify")
        assert only_seg.predict(handle_file(images["rgb"]), "seg", api_name="/compare")[1]["data"]
    finally:
        demo.close()


# ------------------------------------------------------------------------------------ in-process tests
def test_classify_probabilities_sum_to_one(served, images):
    model = next(m for m in served if m.task == "cls")
    probs, ms = predict.classify(model, images["rgba"], k=100)
    assert set(probs) == set(CLASSES) and sum(probs.values()) == pytest.approx(1.0, abs=1e-6) and ms > 0


def test_sliding_windows_on_a_fixed_size_model(served, images):
    seg = next(m for m in served if m.task == "seg")
    side = RECIPES["fashion/seg"]["img_size"]
    assert seg.fixed_size and seg.input_size == (side, side)
    mask, _ = predict.segment(seg, images["large"], max_side=100)  # 100 x 63 px -> several windows
    assert mask.shape == (1500, 2400) and mask.max() < len(seg.class_names)


def _assert_same_predictions(served, others, images, atol):
    """``others`` (another backend) give the served ONNX Runtime models' top-5 and masks (sliding windows)."""
    other = {(m.task, m.name): m for m in others}
    assert {(m.task, m.name) for m in served} == set(other)
    for m in served:
        ref = other[(m.task, m.name)]
        if m.task == "cls":
            a, b = predict.classify(m, images["rgb"])[0], predict.classify(ref, images["rgb"])[0]
            assert list(a) == list(b) and np.allclose(list(a.values()), list(b.values()), atol=atol)
        else:
            a, b = (predict.segment(x, images["large"], max_side=100)[0] for x in (m, ref))
            assert (a == b).mean() > 0.99


def test_pytorch_backend_matches_onnxruntime(models_dir, served, images):
    _assert_same_predictions(served, load_models(models_dir, backend="pytorch"), images, atol=1e-4)


def test_auto_backend_is_a_measured_cpu_runtime_named_on_the_page(served):
    from attnzoo.runtime.backends import cpu_runtimes
    from attnzoo.serve.demo.app import DemoModels, _header

    assert {m.backend for m in served} <= {b.name for b in cpu_runtimes()} and len({m.backend for m in served}) == 1
    note = served[0].backend_note
    assert note.startswith(served[0].backend) and "on this CPU" in note
    if "faster than" in note:  # both runtimes installed: the reason is a measurement on the served files
        assert "median latency at batch 1" in note and "_cls.onnx" in note and "_seg.onnx" in note
    header = _header(DemoModels(served), served[0].backend, "test models")
    assert f"served by **{served[0].backend}**" in header and f"*Backend chosen automatically:* {note}." in header


def test_openvino_backend_matches_pytorch(models_dir, images):
    served = load_models(models_dir, backend="openvino")
    assert all(m.backend == "openvino" and m.fixed_size for m in served)
    # checked against ONNX Runtime at load; here: the same top-5 and masks (sliding windows: batches > 1) as PyTorch
    _assert_same_predictions(served, load_models(models_dir, backend="pytorch"), images, atol=1e-4)


@pytest.mark.tensorrt
def test_tensorrt_backend_matches_onnxruntime(models_dir, served, images, tmp_path):
    from attnzoo.targets.tensorrt.verified import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason(run=True)
    if reason:
        pytest.skip(reason)
    engines = load_models(models_dir, backend="tensorrt", cache_dir=tmp_path)
    assert all(m.backend == "tensorrt" for m in engines)
    _assert_same_predictions(served, engines, images, atol=1e-3)


def test_the_tensorrt_backend_serves_from_the_one_engine_cache(models_dir, tmp_path, monkeypatch):
    """The server builds its engines with the runtime's :func:`build_cached` (the benchmark's cache and key), for
    batch 1 to the sliding windows' batch, under ``<cache>/tensorrt``; a build that fails skips the file with why.
    Checked without a GPU by stopping at the build."""
    from attnzoo.targets import tensorrt as rt
    from attnzoo.targets.tensorrt import builder

    seen = []

    def build_cached(path, folder, **kw):
        seen.append((Path(path).name, Path(folder), kw))
        raise rt.TensorRTError("stopped at the build")

    monkeypatch.setattr(builder, "build_cached", build_cached)  # where the backend looks it up
    with backends.recording_skips() as skipped:
        assert backends.load_onnx_dir(models_dir, "tensorrt", threads=1, cache_dir=tmp_path) == []
    assert sorted(name for name, _, _ in seen) == sorted(p.name for p in models_dir.glob("*.onnx"))
    assert all(
        folder == tmp_path / "tensorrt" and kw == {"batch_sizes": (1, SLIDING_BATCH), "tf32": False}
        for _, folder, kw in seen
    )
    assert set(skipped) == {name for name, _, _ in seen} and all("stopped at the build" in r for r in skipped.values())


def test_non_finite_outputs_are_refused():
    model = ServedModel(
        name="nan",
        variant="standard",
        task="cls",
        class_names=CLASSES,
        input_size=(32, 32),
        mean=(0.5,) * 3,
        std=(0.5,) * 3,
        fixed_size=True,
        run=lambda x: np.full((x.shape[0], len(CLASSES)), np.nan, np.float32),
    )
    with pytest.raises(ValueError, match="non-finite"):
        predict.classify(model, Image.new("RGB", (8, 8)))


def test_shipped_examples_match_their_index():
    idx = examples.index()
    assert {e["task"] for e in idx["examples"]} == {"cls", "seg"}
    for e in idx["examples"]:
        img = Image.open(examples.EXAMPLES_DIR / e["image"])
        assert examples.find_example(img) == e
        if e["task"] == "seg":
            mask = examples.true_mask(e)
            assert mask.shape == (img.height, img.width) and mask.max() <= len(idx["classes"]["seg"]) - 1
            names = {idx["classes"]["seg"][c] for c in np.unique(mask)}
            assert names == set(e["classes"])


def test_examples_are_regenerated_identically(tmp_path):
    data = examples.generate(tmp_path, n_cls=1, n_seg=1)
    shipped = {e["image"]: e for e in examples.index()["examples"]}
    for e in data["examples"]:
        assert e == shipped[e["image"]]


def test_zoo_export_cache_is_reused(monkeypatch, tmp_path):
    from attnzoo import zoo

    model, config = _make_model("standard", "cls")
    rows = [{"variant": "standard", "task": "cls", "data": "toy", "sha256": "abc"}]
    monkeypatch.setattr(zoo, "entries", lambda: rows)
    monkeypatch.setattr(zoo, "manifest", lambda: {"models": rows})
    monkeypatch.setattr(zoo, "load", lambda *a: (model, config))
    folder = backends.export_zoo("toy", tmp_path)
    path = folder / "standard_cls_toy.onnx"
    stamp = path.stat().st_mtime_ns
    assert backends.export_zoo("toy", tmp_path) == folder and path.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="no models trained on 'nothing'"):
        backends.export_zoo("nothing", tmp_path)


@pytest.mark.parametrize(
    "argv, message, code",
    [
        (["--models", "/no/such/dir"], "error: models folder not found", 1),
        (["--port", "0"], "error: --port must be in 1..65535", 2),
        (["--seg-max-side", "0"], "error: --seg-max-side must be at least 1", 2),
        (["--backend", "nope"], "error: --backend: unknown backend 'nope'; valid: eager, compile, aoti, ort-cpu", 2),
    ],
)
def test_cli_errors_are_one_line(argv, message, code):
    """One line, and the exit status docs/errors.md gives: 2 for a bad command line, 1 for a missing input."""
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert info.value.code == code, info.value.code


def test_cli_tensorrt_says_why_it_is_unavailable(tmp_path):
    from attnzoo.targets.tensorrt.verified import tensorrt_unavailable_reason

    if tensorrt_unavailable_reason(run=True) is None:
        pytest.skip("TensorRT and a GPU are available here")
    with pytest.raises(SystemExit, match="error: the tensorrt backend is not available: .*use --backend auto") as info:
        cli_main(["--models", str(tmp_path), "--backend", "tensorrt"])
    assert info.value.code == 1  # a failure, not a bad command line (docs/errors.md)


def test_folder_skips_files_that_are_not_attnzoo_models(models_dir, tmp_path, capsys):
    import onnx

    shutil.copy(models_dir / "standard_cls.onnx", tmp_path / "good.onnx")
    shutil.copy(models_dir / "standard_cls.report.json", tmp_path / "good.report.json")
    shutil.copy(models_dir / "standard_cls.onnx", tmp_path / "unverified.onnx")  # an attnzoo export, no report
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    bare = onnx.load(str(models_dir / "standard_cls.onnx"))
    del bare.metadata_props[:]
    onnx.save(bare, str(tmp_path / "bare.onnx"))
    models = load_models(tmp_path)
    assert [Path(m.source).name for m in models] == ["good.onnx"]
    err = capsys.readouterr().err
    assert "warning: skipping junk.onnx" in err and "warning: skipping bare.onnx: " in err
    assert "warning: skipping unverified.onnx: not served: no verification report unverified.report.json" in err


def test_concurrent_requests_share_one_queue(server, images, monkeypatch):
    """Four users at once on three endpoints: all answered, and never two model calls at the same time."""
    monkeypatch.setitem(ACTIVE, "delay", 0.05)
    monkeypatch.setitem(ACTIVE, "max", 0)
    calls = [
        ("/classify", ("standard",)),
        ("/segment", ("standard", 0.5)),
        ("/compare", ("cls",)),
        ("/classify", ("belief2",)),
    ]
    jobs = [
        Client(server, verbose=False).submit(handle_file(images["rgb"]), *args, api_name=api) for api, args in calls
    ]
    for job in jobs:
        assert job.result(timeout=60)
    assert ACTIVE["max"] == 1


def test_cli_empty_folder(tmp_path):
    with pytest.raises(SystemExit, match="error: no servable models") as info:
        cli_main(["--models", str(tmp_path)])
    assert info.value.code == 1


# ------------------------------------------------------------------------------------------- browser test
@pytest.mark.browser
def test_browser_classify_and_segment(server):
    """Chromium (Debian's, no download) with every non-local request aborted: classify and segment an example,
    see the five labels and the overlay; screenshots go to test-artifacts/."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    from attnzoo.serve.demo.screenshot import capture

    report = capture(server, ROOT / "test-artifacts")
    assert len(report["labels"]) == 5 and set(report["labels"]) <= set(CLASSES)
    assert report["overlay_size"] == Image.open(examples.example_paths("seg")[0]).size
    assert "background" in report["legend"]  # the example's true mask has background: its IoU row is shown
    assert all(f.stat().st_size > 10_000 for f in report["files"]) and len(report["files"]) == 2
    assert not report["blocked"], f"the page tried to reach other hosts: {report['blocked'][:5]}"


def test_palette_has_distinct_coloured_entries_for_every_fashion_class():
    """No class colour is a grey (it would vanish over a gray garment) and no two of the 11 scene classes share
    one; the palette repeats only beyond its length."""
    colours = predict.palette(len(FASHION_SEG_CLASSES)).astype(int)
    assert (colours.max(1) - colours.min(1) > 25).all(), colours
    assert len({tuple(c) for c in colours}) == len(colours)
    many = predict.palette(200)
    assert (many.max(1).astype(int) - many.min(1) > 25).all()


def test_the_demo_launches_without_gradios_share_hint(monkeypatch):
    """The command prints its own line with the URL; Gradio is asked for no share link and no banner (its
    "set share=True" hint), blocking or not."""
    import gradio as gr

    from attnzoo.serve.demo.app import launch

    seen = []
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: seen.append(kw))
    for block in (True, False):
        launch(gr.Blocks(), block=block)
    assert [(kw["share"], kw["quiet"]) for kw in seen] == [(False, True), (False, True)]


def test_ctrl_c_ends_the_background_export_child_without_a_traceback(tmp_path, monkeypatch):
    """Ctrl-C reaches the export child as well as the demo: it exits 130 quietly (the demo prints the one line)."""
    import signal
    import subprocess

    real, children = subprocess.Popen, []

    def popen(argv, **kw):
        children.append(real(argv, stderr=subprocess.PIPE, **kw))
        return children[-1]

    def interrupt():
        if children[0].poll() is None:
            children[0].send_signal(signal.SIGINT)

    monkeypatch.setattr(subprocess, "Popen", popen)
    code = zoo_cache.export_zoo_in_child("fashion", tmp_path, [("standard", "cls")] * 20, while_running=interrupt)
    assert code == 130
    err = children[0].stderr.read()  # its progress bar's last state at most: no traceback, no KeyboardInterrupt
    assert b"Traceback" not in err and b"Interrupt" not in err and b"rror" not in err, err


@pytest.mark.slow
def test_background_zoo_export_runs_at_the_lowest_priority(tmp_path):
    """The child that exports the zoo lowers its own priority (no preexec_fn in a process with threads) and
    writes the verified model."""
    import psutil

    seen = []

    def children_nice():  # the export's child only: not a resource tracker or a child an earlier test left to reap
        for child in psutil.Process().children():
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "export_zoo(" in " ".join(child.cmdline()):
                    seen.append(child.nice())
            except psutil.Error:  # it ended between the listing and the reading
                continue

    code = zoo_cache.export_zoo_in_child("fashion", tmp_path, [("standard", "cls")], while_running=children_nice)
    assert code == 0 and seen and set(seen) == {19}
    assert list((tmp_path / "onnx").glob("*/standard_cls_fashion.onnx"))


def test_a_quiet_zoo_export_child_fails_with_its_one_line(tmp_path, capfd):
    """serve-models verifies its first zoo models in a child process: its failure is the child's one line, raised
    in the parent, and nothing of the child (a traceback, its bars) reaches the terminal."""
    with pytest.raises(ValueError, match=r"^the zoo has no models trained on 'nodata' \(it has: "):
        zoo_cache.export_zoo_in_child("nodata", tmp_path, [("standard", "cls")], quiet=True)
    assert capfd.readouterr().err == ""


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_with_its_one_line(models_dir, tmp_path):
    """``serve-demo`` stopped with Ctrl-C in a terminal (SIGINT to its whole process group) after serving a page:
    exit 130, and after its ``serving ...`` line nothing but ``interrupted (Ctrl-C)``, no line of Gradio's own."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from attnzoo.serve.network import free_port
    from attnzoo.signals import SIGNAL_EXITS

    port = free_port()
    launch = "import sys; from attnzoo.cli import serve_demo; sys.exit(serve_demo())"
    log = tmp_path / "serve-demo.log"  # a file, not a pipe nobody reads
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", launch, "--models", str(models_dir), "--backend", "ort-cpu", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while "serving " not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        while True:  # the line comes just before Gradio listens
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
                time.sleep(0.2)
        assert b"gradio" in page.lower()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = log.read_text(errors="replace").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("serving "))
    assert lines[start + 1 :] == [SIGNAL_EXITS[signal.SIGINT][1]], lines
