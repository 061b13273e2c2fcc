"""export-model --format triton: the repository layout, each config.pbtxt parsed with Triton's own protobuf
schema (tritonclient) and checked against the ONNX graph, and the checks failing when the config is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from attnzoo.export import export_onnx
from attnzoo.export.cli import main as export_main
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.contract import ModelContract
from attnzoo.targets.triton.config import LABELS_FILE, check_config, config_text, model_name, parse_config, write_config
from attnzoo.targets.triton.schema import TritonConfigCheck


def _exit(argv) -> SystemExit:
    with pytest.raises(SystemExit) as info:
        export_main(argv)
    return info.value


@pytest.fixture(scope="module")
def seg_model(tmp_path_factory):
    """A random-init micro segmenter in a Triton model folder (``1/model.onnx``), unverified (fast)."""
    import torch

    from attnzoo.models import create_model

    torch.manual_seed(0)
    model = create_model("belief2", task="seg", arch="micro", num_classes=4).eval()
    folder = tmp_path_factory.mktemp("repo") / "belief2_seg_micro"
    (folder / "1").mkdir(parents=True)
    config = {**model.attnzoo_config, "class_names": ["background", "a", "b", "c"]}
    export_onnx(model, folder / "1" / "model.onnx", config=config, input_hw=(32, 48))
    return folder


def test_cli_writes_a_repository_that_parses_with_tritons_schema(tmp_path, capsys):
    repo = tmp_path / "models"
    assert export_main(["--variant", "standard", "--format", "triton", "--out", str(repo), "--batch-sizes", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "parsed with Triton's schema" in out
    folder = repo / "standard_cls_micro-conv"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "1/model.onnx",
        "1/model.report.json",
        "config.pbtxt",
        LABELS_FILE,
    ]
    cfg = text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    contract = ModelContract.from_onnx(folder / "1" / "model.onnx")
    assert cfg.name == folder.name == model_name(contract)
    assert cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 4
    assert cfg.HasField("dynamic_batching")
    (inp,), (outp,) = cfg.input, cfg.output
    dtype = model_config_pb2.DataType.Name(inp.data_type)
    assert (inp.name, dtype, list(inp.dims)) == ("image", "TYPE_FP32", [3, 28, 28])
    assert (outp.name, list(outp.dims), outp.label_filename) == ("logits", [10], LABELS_FILE)
    assert (folder / LABELS_FILE).read_text().splitlines() == list(contract.class_names)
    # the model in the repository is the verified export, and it answers at max_batch_size
    assert '"passed": true' in (folder / "1" / "model.report.json").read_text()
    sess = onnx_reference().session(folder / "1" / "model.onnx", 1).session
    logits = sess.run(None, {inp.name: np.zeros((4, *inp.dims), np.float32)})[0]
    assert logits.shape == (4, *outp.dims)


def test_seg_config_dims_come_from_the_contract(seg_model):
    contract = ModelContract.from_onnx(seg_model / "1" / "model.onnx")
    check = write_config(seg_model, contract, seg_model / "1" / "model.onnx", "onnxruntime_onnx", 16)
    assert check.input.dims == [3, 32, 48] and check.output.dims == [4, 32, 48] and check.labels == 4
    assert TritonConfigCheck.from_json(check.to_json()) == check  # read back through its schema
    cfg = parse_config((seg_model / "config.pbtxt").read_text())
    assert cfg.max_batch_size == 16 and cfg.dynamic_batching.max_queue_delay_microseconds > 0
    assert (seg_model / LABELS_FILE).read_text().splitlines() == ["background", "a", "b", "c"]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace("dims: [ 3, 32, 48 ]", "dims: [ 3, 32, 32 ]"), "input dims"),
        (lambda t: t.replace('name: "logits"', 'name: "probs"'), "output name"),
        (
            lambda t: t.replace("data_type: TYPE_FP32\n    dims: [ 4", "data_type: TYPE_FP16\n    dims: [ 4"),
            "data_type",
        ),
        (lambda t: t.replace("max_batch_size: 8", "max_batch_size: 0"), "max_batch_size"),
        (lambda t: t.split("dynamic_batching")[0], "dynamic_batching"),
        (lambda t: t.replace('platform: "onnxruntime_onnx"', 'platform: "pytorch_libtorch"'), "platform"),
    ],
)
def test_check_config_catches_a_wrong_config(seg_model, edit, message):
    contract = ModelContract.from_onnx(seg_model / "1" / "model.onnx")
    text = config_text(contract, seg_model.name, "onnxruntime_onnx", 8)
    labels = list(contract.class_names)
    assert check_config(parse_config(text), contract, seg_model / "1" / "model.onnx", labels) == []
    failures = check_config(parse_config(edit(text)), contract, seg_model / "1" / "model.onnx", labels)
    assert failures and any(message in f for f in failures), failures


def test_labels_must_match_the_class_names(seg_model):
    contract = ModelContract.from_onnx(seg_model / "1" / "model.onnx")
    text = config_text(contract, seg_model.name, "onnxruntime_onnx", 8)
    failures = check_config(parse_config(text), contract, seg_model / "1" / "model.onnx", ["background", "a"])
    assert any(LABELS_FILE in f for f in failures)


def test_a_field_triton_does_not_know_is_refused():
    with pytest.raises(ValueError, match="not a valid Triton model config"):
        parse_config('name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_sise: 8\n')


def test_cli_bad_triton_flags(tmp_path):
    err = _exit(["--variant", "standard", "--format", "triton", "--out", str(tmp_path / "m.onnx")])
    assert err.code == 2 and "names the model repository folder" in str(err)
    err = _exit(
        ["--variant", "standard", "--format", "triton", "--out", str(tmp_path / "r"), "--triton-queue-delay-us", "-1"]
    )
    assert err.code == 2 and "--triton-queue-delay-us" in str(err)
    err = _exit(
        ["--variant", "standard", "--format", "triton", "--out", str(tmp_path / "r"), "--triton-platform", "tensorrt"]
    )
    assert err.code == 2 and "--triton-platform tensorrt" in str(err)  # no GPU / TensorRT proper here
    assert not (tmp_path / "r").exists()
