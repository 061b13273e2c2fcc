"""INT8 / FP8 post-training quantization of a verified fp32 export with NVIDIA Model Optimizer (ModelOpt).

``export-model --dtype int8|fp8`` (see :func:`quantize_verified`):

1. the fp32 model is exported and verified as usual (in a temporary folder);
2. ModelOpt's ONNX quantizer (:func:`modelopt.onnx.quantization.quantize`, calibrated on the CPU) places Q/DQ
   nodes, calibrated on real training-split images of the model's data set (:func:`calibration_images`, the
   project's one preprocessing path) or on a user's ``.npy`` file (:func:`load_calibration_file`). By default
   every op under the variant's extra-math scopes (:func:`extra_math_nodes`: the projection, or whatever the
   variant declares in :func:`attnzoo.export.check.expected_scopes`) is excluded and stays fp32;
3. the quantized graph is checked (:func:`qdq_summary`: which MatMul/Gemm/Conv are fed by a DequantizeLinear, and
   that no extra-math op is unless asked for) and scored with ONNX Runtime (CPU) on the test split next to the
   fp32 model in the same run (:func:`evaluate_onnx`). ONNX Runtime's CPU provider cannot run ModelOpt's FP8 graph
   (float8 tensors into Transpose), so FP8 is scored on :func:`simulate_fp8`, the same graph with every FP8
   Q -> DQ pair rewritten into float ops that round to the float8 e4m3 grid exactly as QuantizeLinear does
   (RNE, saturating at +-448) with the same scales;
4. a drop beyond :data:`ACCURACY_TOLERANCE` refuses to write (:class:`AccuracyDropError`) unless
   ``accept_accuracy_drop``; otherwise the model is renamed into place (temp + rename: an interrupted run leaves
   nothing half-written) and its report ``<model>.report.json`` written beside it.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from attnzoo.runtime.sessions import QUANTIZED_DTYPES

from .errors import ExportError

__all__ = ["QDQ_PLACEMENTS", "PLACEMENT_CHOICES", "DEFAULT_QDQ_PLACEMENT", "CPU_QDQ_PLACEMENT", "TENSORRT_QDQ_PLACEMENT",
           "AUTO_QDQ_PLACEMENT", "DEFAULT_MIN_COSINE", "DEFAULT_FIDELITY_COUNT", "FIRM_GATE_INPUTS", "PROMISE_COVERAGE",
           "PROMISE_CONFIDENCE", "FidelityError", "output_agreement", "per_input_fidelity", "onnx_outputs",
           "tolerance_factor", "promised_cosine",
           "qdq_groups", "auto_placement", "heldout_images", "load_calibration_folder", "ACCURACY_TOLERANCE", "DEFAULT_CALIBRATION_COUNT",
           "DEFAULT_CALIBRATION_SEED", "CALIBRATION_METHODS", "FP8_MIN_COMPUTE_CAPABILITY", "QUANTIZED_OP_TYPES",
           "QuantizeReport", "Calibration", "AccuracyDropError", "QuantizationCheckError", "quantize_unavailable_reason",
           "modelopt_version", "extra_math_nodes", "calibration_images", "random_calibration", "load_calibration_file",
           "quantize_onnx", "qdq_placement_error", "qdq_summary", "simulate_fp8", "evaluate_onnx",
           "fp8_compute_capability_error", "check_quantize_arguments", "calibration_for", "quantize_verified",
           "summary"]

#: Largest accuracy drop (percentage points: top-1 for classifiers, mIoU for segmenters) of the quantized model
#: below the fp32 model on the test split that is accepted.
ACCURACY_TOLERANCE: Dict[str, float] = {"cls": 0.5, "seg": 1.0}
DEFAULT_CALIBRATION_COUNT = 512
DEFAULT_CALIBRATION_SEED = 0
#: ModelOpt's calibration method per mode (its own defaults for int8/fp8, named so the report states them).
CALIBRATION_METHODS: Dict[str, str] = {"int8": "entropy", "fp8": "entropy"}
#: FP8 tensor cores: Ada (SM 8.9) and newer.
FP8_MIN_COMPUTE_CAPABILITY: Tuple[int, int] = (8, 9)
#: Op types whose quantization the report counts.
QUANTIZED_OP_TYPES: Tuple[str, ...] = ("MatMul", "Gemm", "Conv")
#: Where ModelOpt puts the Q/DQ nodes (``--qdq-placement``), as extra ``modelopt.onnx.quantization.quantize``
#: arguments. ``tensorrt``: ModelOpt's default, also on residual Adds and the attention core's two matmuls, which
#: TensorRT fuses into int8 kernels. ``cpu``: only in front of the MatMul/Gemm/Conv weights' consumers outside the
#: attention core, the ops ONNX Runtime's CPU kernels run in int8; its other Q/DQ pairs are dequantized straight
#: into fp32 ops (a residual Add into LayerNorm), pure cost there. ViT-S 224, one thread, 2-core Intel Xeon with
#: AMX: ONNX Runtime int8 2.60x / 2.39x fp32 (batch 1 / 8) with ``cpu``, 2.30x / 2.10x with ``tensorrt``
#: (``results/studies/quantized-speed-amx``).
QDQ_PLACEMENTS: Mapping[str, Mapping[str, Any]] = {
    "tensorrt": {},
    "cpu": {"op_types_to_quantize": list(QUANTIZED_OP_TYPES), "disable_mha_qdq": True},
}
#: ModelOpt's own placement (what TensorRT fuses best).
TENSORRT_QDQ_PLACEMENT = "tensorrt"
#: The measured placement (:func:`auto_placement`): ModelOpt's ``tensorrt`` placement calibrated once, then its
#: groups of Q/DQ pairs (each weight MatMul/Gemm/Conv's activation input, each block's attention matmuls and
#: residual Adds) kept only where the output's promised cosine (:func:`promised_cosine`) on the choosing inputs
#: stays within :data:`DEFAULT_MIN_COSINE` of fp32.
AUTO_QDQ_PLACEMENT = "auto"
#: ``--qdq-placement`` choices: ModelOpt's two and the measured one.
PLACEMENT_CHOICES: Tuple[str, ...] = (AUTO_QDQ_PLACEMENT, *QDQ_PLACEMENTS)
#: ``export-model``'s placement: measured, so that a pretrained model with outlier activations is not silently
#: degraded by ModelOpt's full placement, while a model that keeps its fidelity under it keeps all of it.
DEFAULT_QDQ_PLACEMENT = AUTO_QDQ_PLACEMENT
#: The fidelity gate: the smallest cosine similarity between an int8 / fp8 graph's output and the fp32 graph's
#: (each output flattened) on the *worst* of the gate's held-out inputs that is written (``--min-cosine``). The
#: worst, not the mean: a mean of 0.99 lets a quarter of a user's images sit below it. 0.99 separates ModelOpt's
#: full placement from the weights-only one on a pretrained-like ViT (``results/studies/int8-fidelity``).
DEFAULT_MIN_COSINE = 0.99
#: Held-out inputs the fidelity is measured on (``auto``: half choose the placement, half are the gate's). With n
#: gate inputs a further input like them falls below the worst of them with probability 1 / (n + 1) (3 % for 32);
#: how the worst-of-n moves with n on the pretrained-like ViT is in docs/quantization.md.
DEFAULT_FIDELITY_COUNT = 64
#: Fewer gate inputs than this mark the fidelity figure as weak in the report and the summary.
FIRM_GATE_INPUTS = DEFAULT_FIDELITY_COUNT // 2
#: ``auto``'s margin (:func:`promised_cosine`): the placement must promise that this share of inputs like the
#: choosing ones stay within the gate ...
PROMISE_COVERAGE = 0.999
#: ... with this confidence (a one-sided normal tolerance bound on log(1 - cosine)).
PROMISE_CONFIDENCE = 0.90
#: Interleaved batch-1 runs per latency figure of a group ``auto`` kept fp32 (ONNX Runtime CPU, one thread).
SPEED_RUNS = 20
#: The placement of the int8 models this package runs on the CPU itself (bench-latency's ``ort-cpu``, the zoo's
#: int8 copies in the demo and serve-models).
CPU_QDQ_PLACEMENT = "cpu"
_QDQ = ("QuantizeLinear", "DequantizeLinear")
#: Ops that move values without computing on them (followed from a DequantizeLinear to its readers).
_LAYOUT_OPS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten")
_FP8_TYPES = {TensorProto.FLOAT8E4M3FN}


class AccuracyDropError(ExportError):
    """The quantized model lost more accuracy than :data:`ACCURACY_TOLERANCE` allows; nothing was written."""


class QuantizationCheckError(ExportError):
    """The quantized graph breaks a promise (Q/DQ in the extra math, non-finite outputs, no quantized op)."""


class FidelityError(ExportError):
    """The quantized graph's output is further from fp32's than the fidelity gate allows; nothing was written."""


@dataclass
class QuantizeReport:
    """What :func:`quantize_onnx` did (JSON-ready with :meth:`to_dict`).

    Attributes:
        quantizer: ``nvidia-modelopt (modelopt.onnx.quantization.quantize)``.
        quantizer_version: ModelOpt's version.
        mode: ``int8`` or ``fp8``.
        calibration: ``{"source", "count", "seed", "shape", "method", "providers"}``.
        excluded_nodes: Node names kept out of quantization (the extra math unless quantized on purpose).
        qdq: :func:`qdq_summary` of the written graph.
        time_s: Seconds the quantizer took.
        options: The other ModelOpt arguments that matter.
        extra_math_inputs_unquantized: Excluded-op inputs re-pointed at the fp32 tensor ModelOpt had quantized
            for another reader (``node:input``; see :func:`_reroute_extra_math`).
    """

    quantizer: str
    quantizer_version: str
    mode: str
    calibration: Dict[str, Any]
    excluded_nodes: List[str]
    qdq: Dict[str, Any]
    time_s: float
    options: Dict[str, Any] = field(default_factory=dict)
    extra_math_inputs_unquantized: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------------ availability
def modelopt_version() -> Optional[str]:
    """Installed ``nvidia-modelopt`` version, or ``None``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-modelopt")
    except PackageNotFoundError:
        return None


def quantize_unavailable_reason() -> Optional[str]:
    """Why ``--dtype int8|fp8`` cannot run here (ModelOpt's ONNX quantizer missing), else ``None``."""
    if modelopt_version() is None:
        return 'needs NVIDIA ModelOpt: pip install -e ".[quantize]" (included in [dev])'
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import modelopt.onnx.quantization  # noqa: F401
    except ImportError as exc:
        return (f"ModelOpt's ONNX quantizer cannot be imported ({str(exc).splitlines()[0]}); "
                'reinstall with pip install -e ".[quantize]"')
    return None


def fp8_compute_capability_error(compute_capability: Optional[str]) -> Optional[str]:
    """One line when a TensorRT target cannot run FP8 (below SM 8.9), else ``None``.

    ``compute_capability`` is a name of :data:`attnzoo.runtime.tensorrt.COMPUTE_CAPABILITIES`; ``None`` is the
    build default (the GPU present, else ``DEFAULT_COMPUTE_CAPABILITY``); ``CURRENT`` asks the GPU.
    """
    from attnzoo.runtime.tensorrt import gpu_available, resolve_compute_capability

    try:
        cc = resolve_compute_capability(compute_capability, gpu_available())
    except ValueError as exc:  # an unknown name, or CURRENT without a GPU: the build would refuse it the same way
        return str(exc)
    if cc == "CURRENT":
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        name = f"the GPU present (SM{major}{minor})"
    else:
        digits = cc[2:]
        major, minor = int(digits[:-1]), int(digits[-1])
        name = cc
    if (major, minor) < FP8_MIN_COMPUTE_CAPABILITY:
        need = "SM{}{}".format(*FP8_MIN_COMPUTE_CAPABILITY)
        return f"--dtype fp8 needs compute capability {need} or newer (FP8 tensor cores); {name} has none"
    return None


def qdq_placement_error(placement: str, dtype: str) -> Optional[str]:
    """One line saying why ``placement`` cannot be used for ``dtype``, or ``None``."""
    if placement not in PLACEMENT_CHOICES:
        return f"unknown Q/DQ placement {placement!r}; valid: {', '.join(PLACEMENT_CHOICES)}"
    if placement == CPU_QDQ_PLACEMENT and dtype != "int8":
        return f"--qdq-placement cpu is for int8 on the CPU runtimes; {dtype} is TensorRT's (use tensorrt)"
    return None


def check_quantize_arguments(dtype: str, fmt: str, compute_capability: Optional[str],
                             options: Mapping[str, Any]) -> None:
    """Refuse quantization arguments that cannot work, before any work (ModelOpt missing, FP8 below SM 8.9, a
    placement for another dtype or target, bad counts, a bad calibration file).

    Args:
        dtype, fmt, compute_capability: The export's.
        options: ``quantize_extra_math``, ``placement``, ``calibration_data``, ``calibration_count``,
            ``calibration_seed``, ``accept_accuracy_drop``, ``eval_limit`` (``None`` / ``False``: not given).

    Raises:
        ValueError: one line naming the flag.
    """
    flags = {"--quantize-extra-math": options.get("quantize_extra_math"),
             "--qdq-placement": options.get("placement") is not None,
             "--calibration-data": options.get("calibration_data") is not None,
             "--calibration-count": options.get("calibration_count") is not None,
             "--calibration-seed": options.get("calibration_seed") is not None,
             "--accept-accuracy-drop": options.get("accept_accuracy_drop"),
             "--eval-limit": options.get("eval_limit") is not None,
             "--min-cosine": options.get("min_cosine") is not None,
             "--fidelity-count": options.get("fidelity_count") is not None}
    if dtype not in QUANTIZED_DTYPES:
        given = [flag for flag, value in flags.items() if value]
        if given:
            raise ValueError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --dtype int8 / fp8 only")
        return
    if fmt == "triton":
        raise ValueError(f"--dtype {dtype}: --format triton is not supported yet; export the ONNX (--format onnx) "
                         "or a TensorRT engine")
    if dtype == "fp8" and fmt == "tensorrt":
        error = fp8_compute_capability_error(compute_capability)
        if error:
            raise ValueError(error)
    placement = options.get("placement")
    error = qdq_placement_error(placement or DEFAULT_QDQ_PLACEMENT, dtype)
    if error:
        raise ValueError(error)
    if placement == CPU_QDQ_PLACEMENT and fmt == "tensorrt":
        raise ValueError("--qdq-placement cpu is for ONNX Runtime on the CPU; a TensorRT engine wants the tensorrt "
                         "placement (the default)")
    reason = quantize_unavailable_reason()
    if reason:
        raise ValueError(f"--dtype {dtype} {reason}")
    for flag in ("calibration_count", "eval_limit"):
        value = options.get(flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    for flag in ("fidelity_count",):
        value = options.get(flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    min_cosine = options.get("min_cosine")
    if min_cosine is not None and not 0.0 <= min_cosine <= 1.0:
        raise ValueError(f"--min-cosine must be in 0..1, got {min_cosine}")
    data = options.get("calibration_data")
    if data is not None and not Path(data).is_dir():
        if flags["--calibration-count"] or flags["--calibration-seed"]:
            raise ValueError("--calibration-count/--calibration-seed draw images from the training split or a "
                             "folder; the images of a .npy --calibration-data are used as they are")
        load_calibration_file(data, None)  # shape (but H, W), dtype, emptiness


# ------------------------------------------------------------------------------------------------ extra math
def extra_math_nodes(proto: onnx.ModelProto, config: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Names of the nodes under the variant's extra-math scopes (e.g. ``blocks.0.attn.projection/...``).

    The scopes are :func:`attnzoo.export.check.expected_scopes` for the graph's depth; a node belongs to a scope
    when its name is the scope or starts with ``scope + "/"``. Empty for variants without extra math.

    Args:
        proto: An attnzoo export (fp32, or a quantized copy: the Q/DQ nodes ModelOpt adds are never named
            inside a scope unless quantizing it).
        config: The model config; default from the graph's metadata.
    """
    from .check import _block_prefix, expected_scopes, graph_depth
    from .onnx_export import config_from_props, metadata_props

    config = dict(config) if config is not None else config_from_props(metadata_props(proto))
    scopes = expected_scopes(config, graph_depth(proto, _block_prefix(config)))
    return [n.name for n in proto.graph.node if any(n.name == s or n.name.startswith(s + "/") for s in scopes)]


# ------------------------------------------------------------------------------------------------ calibration
def calibration_images(config: Mapping[str, Any], count: int = DEFAULT_CALIBRATION_COUNT,
                       seed: int = DEFAULT_CALIBRATION_SEED) -> np.ndarray:
    """``count`` training-split images of the model's data set, float32 NCHW, preprocessed as the model expects.

    Loaded with :func:`attnzoo.data.datasets.load_data` (the split the model was trained on, its image size and
    data seed) and normalised with the model's mean/std by :func:`attnzoo.preprocess.normalize`, exactly as the
    evaluation does it. Classifiers: ``count`` images drawn without replacement with
    ``numpy.random.default_rng(seed)``; segmenters: ``count`` training scenes composed from training garments
    with scene seed ``data_seed + 1 + seed`` (so not the very scenes the model was trained on).

    Raises:
        ValueError: the config names no data set (an untrained or config-less model), or ``count`` < 1.
    """
    from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
    from attnzoo.data.datasets import load_data

    if count < 1:
        raise ValueError(f"calibration count must be >= 1, got {count}")
    data = config.get("data")
    if not data or config.get("untrained"):
        raise ValueError("the model names no data set to calibrate on (untrained or config-less); pass "
                         "--calibration-data FILE.npy, or --random-init to calibrate on random inputs")
    size = int(config["img_size"])
    task = config["task"]
    data_seed = int(config.get("data_seed", 0))
    if task == "seg":  # composed scenes: draw exactly `count` training scenes
        images = load_data(data, "train", task, size, n=count, seed=data_seed + 1 + seed,
                           scene=config.get("scene")).images
    else:
        images = load_data(data, "train", task, size, seed=data_seed).images
        if count < len(images):
            images = images[np.sort(np.random.default_rng(seed).choice(len(images), count, replace=False))]
    return normalize(images, config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))


def heldout_images(config: Mapping[str, Any], count: int = DEFAULT_FIDELITY_COUNT,
                   calibration_count: int = DEFAULT_CALIBRATION_COUNT,
                   seed: int = DEFAULT_CALIBRATION_SEED) -> np.ndarray:
    """``count`` training-split images that :func:`calibration_images` (``calibration_count``, ``seed``) does not
    draw, preprocessed the same way: the held-out inputs the fidelity to fp32 is measured on.

    Classifiers: drawn with ``default_rng(seed + 1)`` from the images outside the calibration draw; segmenters:
    ``count`` scenes composed with another scene seed than the calibration's.

    Raises:
        ValueError: as :func:`calibration_images`.
    """
    from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
    from attnzoo.data.datasets import load_data

    if count < 1:
        raise ValueError(f"held-out count must be >= 1, got {count}")
    data = config.get("data")
    if not data or config.get("untrained"):
        raise ValueError("the model names no data set to hold images out of")
    size, task, data_seed = int(config["img_size"]), config["task"], int(config.get("data_seed", 0))
    if task == "seg":
        images = load_data(data, "train", task, size, n=count, seed=data_seed + 1 + seed + 7919).images
    else:
        images = load_data(data, "train", task, size, seed=data_seed).images
        taken = np.zeros(len(images), bool)
        if calibration_count < len(images):
            taken[np.random.default_rng(seed).choice(len(images), calibration_count, replace=False)] = True
        else:
            taken[:] = True
        free = np.flatnonzero(~taken)
        if not len(free):
            raise ValueError("every training image was used for calibration; none is left to hold out")
        pick = np.random.default_rng(seed + 1).choice(free, min(count, len(free)), replace=False)
        images = images[np.sort(pick)]
    return normalize(images, config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))


def load_calibration_folder(path: Union[str, Path], config: Mapping[str, Any], input_hw: Tuple[int, int],
                            count: int, seed: int = DEFAULT_CALIBRATION_SEED) -> np.ndarray:
    """Up to ``count`` images of a folder (searched recursively), drawn with ``default_rng(seed)``, preprocessed as
    the model's metadata says: :func:`attnzoo.preprocess.load_image` (any mode, EXIF turned, the pixel cap),
    converted to the model's input style, resized to ``input_hw`` and normalised with its mean/std.

    Raises:
        ValueError: one line: no such folder, no image in it (naming what was skipped: symlinked folders, which
            are not followed, and files of other types), or an unreadable or too large image (named).
    """
    from PIL import Image

    from attnzoo.data.datasets import IMAGE_SUFFIXES
    from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, input_style_of, load_image, normalize, to_input_style

    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"--calibration-data {folder}: no such folder")
    entries = list(folder.rglob("*"))  # symlinked folders are not descended into (no loops, nothing outside)
    files = sorted(p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        links = sorted(str(p.relative_to(folder)) for p in entries if p.is_symlink() and p.is_dir())
        others = sum(p.is_file() for p in entries)
        skipped = []
        if links:
            skipped.append(f"{len(links)} symlinked folder(s), not followed: {', '.join(links[:5])}")
        if others:
            skipped.append(f"{others} file(s) of other types")
        raise ValueError(f"--calibration-data {folder}: no images ({', '.join(IMAGE_SUFFIXES)}) in it"
                         + (f"; skipped {' and '.join(skipped)}" if skipped else ""))
    if count < len(files):
        files = [files[i] for i in np.sort(np.random.default_rng(seed).choice(len(files), count, replace=False))]
    style, (h, w) = input_style_of(config), input_hw
    pixels = []
    for file in files:
        try:
            img = to_input_style(load_image(file), style, config["task"])
        except ValueError as exc:
            raise ValueError(f"--calibration-data {file}: {exc}") from None
        pixels.append(np.asarray(img.resize((w, h), Image.BILINEAR), np.uint8))
    return normalize(np.stack(pixels), config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))


def random_calibration(input_hw: Tuple[int, int], count: int = DEFAULT_CALIBRATION_COUNT,
                       seed: int = DEFAULT_CALIBRATION_SEED) -> np.ndarray:
    """Standard-normal float32 NCHW inputs (``--random-init``: an untrained model has no data set)."""
    return np.random.default_rng(seed).standard_normal((count, 3, *input_hw)).astype(np.float32)


def load_calibration_file(path: Union[str, Path], input_hw: Optional[Tuple[int, int]]) -> np.ndarray:
    """A user's calibration batch: a ``.npy`` array (never unpickled) of float NCHW inputs, already normalised.

    ``input_hw`` ``None`` checks everything but the spatial size (before the model is loaded).

    Raises:
        ValueError: one line: missing/unreadable file, a pickle, wrong shape (must be ``(N, 3, H, W)``), a
            non-float dtype, no images, or non-finite values.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--calibration-data {path}: no such file or folder")
    try:
        x = np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:  # object arrays need pickle: refused
        raise ValueError(f"--calibration-data {path}: not a plain .npy array ({str(exc).splitlines()[0]})") from None
    except OSError as exc:
        raise ValueError(f"--calibration-data {path}: cannot read it as .npy ({exc})") from None
    if not isinstance(x, np.ndarray):
        raise ValueError(f"--calibration-data {path}: an .npz archive; save one array with numpy.save")
    want = ("3", *(map(str, input_hw) if input_hw else ("H", "W")))
    if x.ndim != 4 or x.shape[1] != 3 or (input_hw and tuple(x.shape[2:]) != tuple(input_hw)):
        raise ValueError(f"--calibration-data {path}: shape {tuple(x.shape)}, the model takes (N, {', '.join(want)}) "
                         "float32 images normalised with its mean/std")
    if x.dtype.kind != "f":
        raise ValueError(f"--calibration-data {path}: dtype {x.dtype}, need float32 (normalised images, not raw "
                         "pixels)")
    if x.shape[0] == 0:
        raise ValueError(f"--calibration-data {path}: holds no images (shape {tuple(x.shape)})")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError(f"--calibration-data {path}: holds NaN or infinite values")
    return x


@dataclass
class Calibration:
    """The inputs an int8 / fp8 export is calibrated on, the held-out inputs its fidelity is measured on, and
    what they are.

    Attributes:
        inputs: float32 NCHW, normalised as the model expects.
        source: What they are, for the report (e.g. ``fashion training split``).
        seed: The seed of their draw (``None`` for a user's array).
        labelled: The model has a labelled test split to be scored on (a trained zoo-style model).
        held_out: Inputs of the same source never calibrated on.
        random: Random inputs, not images.
        warnings: What the user should know (random inputs, few held-out inputs).
    """

    inputs: np.ndarray
    source: str
    seed: Optional[int]
    labelled: bool
    held_out: Optional[np.ndarray] = None
    random: bool = False
    warnings: List[str] = field(default_factory=list)


def _split(x: np.ndarray, held: int, what: str) -> Tuple[np.ndarray, np.ndarray]:
    """The last ``held`` of ``x`` held out, at most a quarter and at least one; the rest calibrates."""
    n = len(x)
    if n < 2:
        raise ValueError(f"{what}: {n} image(s); at least 2 are needed (one to calibrate on, one held out to "
                         "measure the fidelity)")
    held = max(1, min(held, n // 4))
    return np.ascontiguousarray(x[: n - held]), np.ascontiguousarray(x[n - held:])


def calibration_for(config: Mapping[str, Any], input_hw: Tuple[int, int], *, untrained: bool = False,
                    calibration_data: Optional[Union[str, Path]] = None, calibration_count: Optional[int] = None,
                    calibration_seed: Optional[int] = None,
                    fidelity_count: Optional[int] = None) -> Calibration:
    """The calibration and held-out inputs ``export-model --dtype int8|fp8`` uses.

    ``calibration_data``: a folder of images (the model's preprocessing from its metadata,
    :func:`load_calibration_folder`) or a ``.npy`` array of normalised inputs (:func:`load_calibration_file`), the
    last ``fidelity_count`` (at most a quarter) held out; else the model's training split
    (:func:`calibration_images`, :func:`heldout_images`); else random inputs: for an untrained model, and with a
    warning for a trained one (a converted pretrained model should be calibrated on images like its inputs).

    Raises:
        ValueError: a bad calibration file or folder.
    """
    count = calibration_count or DEFAULT_CALIBRATION_COUNT
    held = fidelity_count or DEFAULT_FIDELITY_COUNT
    seed = DEFAULT_CALIBRATION_SEED if calibration_seed is None else calibration_seed
    labelled = bool(config.get("data")) and not untrained
    warnings: List[str] = []
    if calibration_data is not None:
        path = Path(calibration_data)
        if path.is_dir():
            x = load_calibration_folder(path, config, input_hw, count + held, seed)
            what, used_seed = f"--calibration-data {path} (images, preprocessed from the model's metadata)", seed
        else:
            x, what, used_seed = load_calibration_file(path, input_hw), f"--calibration-data {path}", None
        inputs, held_out = _split(x, held, f"--calibration-data {path}")
        if len(held_out) < held:
            warnings.append(f"fidelity measured on only {len(held_out)} held-out input(s) of {path} (a quarter of "
                            f"its {len(x)}; {len(inputs)} calibrate): a weak figure; give {4 * held} images or more "
                            "for a firm one")
        return Calibration(inputs, what, used_seed, labelled, held_out, False, warnings)
    if untrained or not config.get("data"):
        if not untrained:
            warnings.append("calibrated on random (standard normal) inputs: a trained model's activations on real "
                            "inputs differ, and its fidelity was measured on random inputs too; pass "
                            "--calibration-data with a folder of images like its inputs")
        else:
            warnings.append(f"--random-init: calibrating the UNTRAINED model on {count} random (standard normal) "
                            "inputs; the quantized model's accuracy is meaningless and is not measured")
        return Calibration(random_calibration(input_hw, count, seed), "random standard-normal inputs", seed, False,
                           random_calibration(input_hw, held, seed + 1), True, warnings)
    x = calibration_images(config, count, seed)
    if x.shape[2:] != tuple(input_hw):
        raise ValueError(f"the training images are {x.shape[2]}x{x.shape[3]}, --input-size "
                         f"{input_hw[0]}x{input_hw[1]}; calibrate at the training size or pass --calibration-data")
    return Calibration(np.ascontiguousarray(x), f"{config['data']} training split", seed, labelled,
                       heldout_images(config, held, count, seed))


# ------------------------------------------------------------------------------------------------ quantization
def _producers(proto: onnx.ModelProto) -> Dict[str, onnx.NodeProto]:
    return {o: n for n in proto.graph.node for o in n.output}


def _constants(proto: onnx.ModelProto) -> set:
    """Names of the graph's initializers and Constant outputs."""
    return {t.name for t in proto.graph.initializer} | {o for n in proto.graph.node if n.op_type == "Constant"
                                                        for o in n.output}


def _fed_by_dq(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto]) -> bool:
    """A node reads a DequantizeLinear output (possibly through layout ops that keep the values)."""
    for name in node.input:
        p = producers.get(name)
        while p is not None and p.op_type in _LAYOUT_OPS:
            p = producers.get(p.input[0])
        if p is not None and p.op_type == "DequantizeLinear":
            return True
    return False


def _reroute_extra_math(proto: onnx.ModelProto, extra_nodes: Sequence[str], weights: bool = True) -> List[str]:
    """Make extra-math ops read fp32 values where ModelOpt quantized a tensor they share with a quantized op.

    ModelOpt quantizes a *tensor* once: when the attention's ``V`` feeds both a quantized MatMul and the
    projection (through a Transpose/Reshape), every consumer reads the dequantized ``V``, excluded or not. Here
    each extra-math input that comes from a ``QuantizeLinear -> DequantizeLinear`` pair (through layout ops) is
    re-pointed at the pair's fp32 input (layout ops cloned as ``<name>__fp32``); layout and Q/DQ nodes left
    without consumers are removed. ``weights=False`` leaves an input whose ``QuantizeLinear`` reads a constant (a
    weight) quantized. Returns the extra-math inputs re-pointed (``node:input``).
    """
    producers = _producers(proto)
    consts = _constants(proto)
    extra = set(extra_nodes)
    clones: Dict[str, List[onnx.NodeProto]] = {}
    fp32_name: Dict[str, Optional[str]] = {}

    def unquantized(name: str) -> Optional[str]:
        if name in fp32_name:
            return fp32_name[name]
        p, found = producers.get(name), None
        if p is not None and p.op_type == "DequantizeLinear":
            q = producers.get(p.input[0])
            found = q.input[0] if q is not None and q.op_type == "QuantizeLinear" and (
                weights or q.input[0] not in consts) else None
        elif p is not None and p.op_type in _LAYOUT_OPS:
            src = unquantized(p.input[0])
            if src is not None:
                clone = onnx.NodeProto.FromString(p.SerializeToString())
                clone.name = f"{p.name}__fp32"
                clone.input[0] = src
                del clone.output[:]
                clone.output.extend(f"{o}__fp32" for o in p.output)
                clones.setdefault(p.name, []).append(clone)
                found = clone.output[0]
        fp32_name[name] = found
        return found

    rerouted = []
    for node in proto.graph.node:
        if node.name in extra:
            for i, name in enumerate(node.input):
                src = unquantized(name) if name else None
                if src is not None:
                    node.input[i] = src
                    rerouted.append(f"{node.name}:{i}")
    nodes = [m for n in proto.graph.node for m in (n, *clones.get(n.name, ()))]
    outputs = {o.name for o in proto.graph.output}
    while True:  # drop layout / Q/DQ nodes nobody reads any more
        used = {i for n in nodes for i in n.input} | outputs
        keep = [n for n in nodes if n.op_type not in (*_LAYOUT_OPS, *_QDQ) or any(o in used for o in n.output)]
        if len(keep) == len(nodes):
            break
        nodes = keep
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return rerouted


def qdq_summary(proto: onnx.ModelProto, extra_nodes: Sequence[str]) -> Dict[str, Any]:
    """Where the Q/DQ nodes of a quantized graph are.

    Returns:
        ``{"quantize_linear", "dequantize_linear", "quantized_ops": {MatMul/Gemm/Conv: n quantized},
        "total_ops": {op: n}, "quantized_matmuls": [names fed by a DequantizeLinear], "extra_math_nodes": n,
        "extra_math_quantized": [extra-math nodes fed by a DequantizeLinear or Q/DQ named inside a scope]}``.
    """
    producers = _producers(proto)
    extra = set(extra_nodes)
    scopes = {n.rsplit("/", 1)[0] for n in extra}
    counts = Counter(n.op_type for n in proto.graph.node)
    quantized: Counter = Counter()
    matmuls, in_extra = [], []
    for node in proto.graph.node:
        fed = _fed_by_dq(node, producers)
        if node.op_type in QUANTIZED_OP_TYPES and fed:
            quantized[node.op_type] += 1
            if node.op_type == "MatMul":
                matmuls.append(node.name)
        if (node.name in extra and fed) or (node.op_type in _QDQ and node.name.rsplit("/", 1)[0] in scopes):
            in_extra.append(node.name)
    return {"quantize_linear": counts["QuantizeLinear"], "dequantize_linear": counts["DequantizeLinear"],
            "quantized_ops": {op: quantized[op] for op in QUANTIZED_OP_TYPES},
            "total_ops": {op: counts[op] for op in QUANTIZED_OP_TYPES},
            "quantized_matmuls": matmuls, "extra_math_nodes": len(extra), "extra_math_quantized": in_extra}


# ------------------------------------------------------------------------------------------------ fidelity
def per_input_fidelity(reference: np.ndarray, output: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per input (its output flattened): cosine similarity to the reference (0 for a non-finite output), relative
    L2 error ``|out - ref| / |ref|``, and whether the output is finite."""
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    out = output.reshape(len(output), -1).astype(np.float64)
    finite = np.isfinite(out).all(axis=1)
    out = np.where(np.isfinite(out), out, 0.0)
    norm_r, norm_o = np.linalg.norm(ref, axis=1), np.linalg.norm(out, axis=1)
    cos = np.where(finite, (ref * out).sum(1) / np.maximum(norm_r * norm_o, 1e-30), 0.0)
    rel = np.linalg.norm(out - ref, axis=1) / np.maximum(norm_r, 1e-30)
    return cos, rel, finite


def output_agreement(reference: np.ndarray, output: np.ndarray, task: str) -> Dict[str, Any]:
    """How close a quantized graph's outputs are to the fp32 graph's on the same inputs.

    Per input (its output flattened): cosine similarity and relative L2 error ``|out - ref| / |ref|``; the top-1
    agreement (per image for classifiers, per pixel for segmenters) and, for classifiers with 5 classes or more,
    the mean overlap of the top-5 sets; :func:`promised_cosine` of the cosines. A non-finite output counts as
    cosine 0.

    Returns:
        ``{"n_inputs", "cosine": {"min", "mean"}, "relative_error": {"mean", "max"}, "promised_cosine",
        "top1_agreement", "top5_overlap" (classifiers with >= 5 classes), "finite"}``.
    """
    cos, rel, finite = per_input_fidelity(reference, output)
    agree = reference.argmax(1) == np.where(np.isfinite(output), output, -np.inf).argmax(1)
    result = {"n_inputs": int(len(cos)), "cosine": {"min": float(cos.min()), "mean": float(cos.mean())},
              "relative_error": {"mean": float(rel.mean()), "max": float(rel.max())},
              "promised_cosine": promised_cosine(cos), "top1_agreement": float(agree.mean()),
              "finite": bool(finite.all())}
    if task == "cls" and reference.shape[1] >= 5:
        top_r, top_o = np.argsort(-reference, 1)[:, :5], np.argsort(-output, 1)[:, :5]
        result["top5_overlap"] = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top_r, top_o)]))
    return result


def tolerance_factor(n: int, coverage: float = PROMISE_COVERAGE, confidence: float = PROMISE_CONFIDENCE) -> float:
    """The one-sided normal tolerance factor k: with probability ``confidence`` at least ``coverage`` of a normal
    population lies below ``mean + k * sd`` of ``n`` draws from it, ``nct.ppf(confidence, n - 1, z sqrt(n)) /
    sqrt(n)`` with ``z`` the ``coverage`` quantile (NIST/SEMATECH e-Handbook 7.2.6.3; SciPy comes with
    ModelOpt). ``inf`` below 3 draws."""
    from scipy.stats import nct, norm

    if n < 3:
        return float("inf")
    return float(nct.ppf(confidence, n - 1, norm.ppf(coverage) * np.sqrt(n)) / np.sqrt(n))


def promised_cosine(cosines: np.ndarray, coverage: float = PROMISE_COVERAGE,
                    confidence: float = PROMISE_CONFIDENCE) -> float:
    """The cosine that ``coverage`` of inputs like these stay above, with ``confidence``: ``1 - exp(m + k s)``,
    ``m`` and ``s`` the mean and standard deviation of ``log(1 - cosine)`` over them (a log-normal fit of the
    error; ``k`` :func:`tolerance_factor`), and never above the worst of them. The wider their spread and the
    fewer they are, the further below their worst it lies: the margin ``auto`` chooses with. ``0`` below 3
    inputs (nothing can be promised)."""
    cos = np.asarray(cosines, np.float64)
    k = tolerance_factor(len(cos), coverage, confidence)
    if not np.isfinite(k):
        return 0.0
    log_err = np.log(np.clip(1.0 - cos, 1e-12, None))
    bound = 1.0 - float(np.exp(log_err.mean() + k * log_err.std(ddof=1)))
    return max(0.0, min(bound, float(cos.min())))


def onnx_outputs(model: Union[Path, onnx.ModelProto], x: np.ndarray, threads: Optional[int]) -> np.ndarray:
    """The graph's outputs on ``x`` with ONNX Runtime (CPU), in batches."""
    from attnzoo.runtime.evaluate import EVAL_BATCH, cpu_session

    sess = cpu_session(model, threads)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + EVAL_BATCH]})[0] for i in range(0, len(x), EVAL_BATCH)])


def _block_of(name: str) -> str:
    """``blocks.3.attn/MatMul`` -> ``blocks.3`` (``encoder.blocks.3`` in a Segmenter); ``other`` outside blocks."""
    match = re.match(r"^((?:encoder\.)?blocks\.\d+)[./]", name)
    return match.group(1) if match else "other"


def qdq_groups(proto: onnx.ModelProto, fixed: Sequence[str] = ()) -> Dict[str, Dict[str, Any]]:
    """The activation Q/DQ pairs of a ModelOpt graph, grouped: ``<module> input`` (kind ``weights``: the
    activation input of one weight MatMul/Gemm/Conv, e.g. ``blocks.3.mlp.fc1 input``; its weight stays int8),
    ``<block> attention`` (attention's two matmuls: both inputs are activations) and ``<block> residual`` (the
    residual Adds and whatever else reads a dequantized activation that is not a weight matmul). Nodes in
    ``fixed`` (the extra math under ``--quantize-extra-math``) belong to no group: they stay quantized.

    Returns:
        ``{group: {"kind": "weights" | "attention" | "residual", "block", "nodes": [reader names]}}`` (the readers
        to point back at fp32 values to leave the group unquantized, :func:`_reroute_extra_math`).
    """
    producers = _producers(proto)
    consts = _constants(proto)

    def source(name: str) -> Optional[onnx.NodeProto]:
        p = producers.get(name)
        while p is not None and p.op_type in _LAYOUT_OPS:
            p = producers.get(p.input[0])
        return p

    def dq_of(name: str) -> Tuple[Optional[onnx.NodeProto], Optional[onnx.NodeProto]]:
        """The DequantizeLinear behind ``name`` (through layout ops) and the QuantizeLinear feeding it."""
        p = source(name)
        if p is None or p.op_type != "DequantizeLinear":
            return None, None
        q = producers.get(p.input[0])
        return p, q if q is not None and q.op_type == "QuantizeLinear" else None

    def weight(name: str) -> bool:  # a constant, or a constant quantized (int8 stored, or fp32 -> Q -> DQ)
        p, q = dq_of(name)
        return name in consts or (p is not None and (q is None or q.input[0] in consts))

    def activation_dq(name: str) -> bool:
        p, q = dq_of(name)
        return q is not None and q.input[0] not in consts

    groups: Dict[str, Dict[str, Any]] = {}
    fixed = set(fixed)
    for node in proto.graph.node:
        if node.op_type in _QDQ or node.name in fixed or not any(activation_dq(i) for i in node.input if i):
            continue
        block = _block_of(node.name)
        if node.op_type in QUANTIZED_OP_TYPES and any(weight(i) for i in node.input if i):
            kind, name = "weights", f"{node.name.split('/')[0]} input"
        else:
            kind = "attention" if node.op_type == "MatMul" else "residual"
            name = f"{block} {kind}"
        group = groups.setdefault(name, {"kind": kind, "block": block, "nodes": []})
        group["nodes"].append(node.name)
    return groups


def _without(proto: onnx.ModelProto, groups: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``proto`` whose ``names`` groups read fp32 values (their Q/DQ pairs bypassed)."""
    copy = onnx.ModelProto.FromString(proto.SerializeToString())
    _reroute_extra_math(copy, [n for g in names for n in groups[g]["nodes"]], weights=False)
    return copy


def auto_placement(proto: onnx.ModelProto, reference: np.ndarray, x: np.ndarray, task: str, *,
                   min_cosine: float = DEFAULT_MIN_COSINE, runnable=lambda p: p, threads: Optional[int] = None,
                   fixed: Sequence[str] = ()) -> Tuple[onnx.ModelProto, Dict[str, Any]]:
    """Choose which Q/DQ pairs of ModelOpt's full (``tensorrt``) placement to keep, by measurement, with a margin.

    A candidate qualifies when its :func:`promised_cosine` on ``x`` (the cosine that 99.9 % of inputs like
    ``x`` stay above, with 90 % confidence: below the worst of ``x`` by a margin that grows with their spread
    and shrinks with their number) is at least ``min_cosine``. In order: ModelOpt's full placement, kept whole
    when it qualifies; else the weight MatMul/Gemm/Conv inputs (:func:`qdq_groups` kind ``weights``) all
    quantized when they qualify together, then each block's attention matmuls and residual Adds added back least
    harmful first (measured alone on top), each only while the graph still qualifies; else the same greedy
    choice over every group, weight inputs first, from the graph with no activation quantized. When even that
    graph, or no group on it, qualifies, ``decision["promised"]`` is ``False``: no placement can promise the
    gate, and :func:`quantize_verified` refuses.

    Args:
        proto: ModelOpt's Q/DQ graph (``tensorrt`` placement).
        reference: The fp32 graph's outputs on ``x``.
        x: Held-out inputs (not the calibration batch, and not those the final gate measures).
        runnable: Turns a candidate into what ONNX Runtime runs (:func:`simulate_fp8` for fp8).
        fixed: Nodes whose Q/DQ stay whatever the choice (the extra math under ``--quantize-extra-math``).

    Returns:
        ``(chosen graph, decision)``; the decision names every group, whether it was quantized and why, the
        figures of the full, weights-only and chosen graphs, and the rule.
    """
    groups = qdq_groups(proto, fixed)
    seen: Dict[frozenset, Dict[str, float]] = {}

    def measure(names: Sequence[str]) -> Dict[str, float]:
        key = frozenset(names)
        if key not in seen:
            candidate = _without(proto, groups, [g for g in groups if g not in key])
            cos = per_input_fidelity(reference, onnx_outputs(runnable(candidate), x, threads))[0]
            seen[key] = {"worst": float(cos.min()), "mean": float(cos.mean()), "promised": promised_cosine(cos)}
        return seen[key]

    k = tolerance_factor(len(x))
    decision: Dict[str, Any] = {
        "min_cosine": min_cosine, "selection_inputs": int(len(x)), "tolerance_factor": k,
        "rule": f"a placement qualifies when the cosine that {PROMISE_COVERAGE:.1%} of inputs like the {len(x)} "
                f"choosing ones stay above, with {PROMISE_CONFIDENCE:.0%} confidence (log-normal fit of 1 - cosine: "
                f"1 - exp(mean + {k:.2f} sd) of its log, at most their worst), is >= {min_cosine:g}",
        "groups": {}}
    weights = [g for g in groups if groups[g]["kind"] == "weights"]
    others = [g for g in groups if g not in weights]
    full = decision["all_quantized"] = measure(list(groups))
    if full["promised"] >= min_cosine or not groups:
        for name, g in groups.items():
            decision["groups"][name] = {"kind": g["kind"], "quantized": True,
                                        "why": "the full placement qualifies"}
        decision.update(chosen=full, promised=full["promised"] >= min_cosine)
        return proto, decision
    base = decision["weights_only"] = measure(weights)
    if base["promised"] >= min_cosine:
        chosen, order = list(weights), others
        for name in weights:
            decision["groups"][name] = {"kind": "weights", "quantized": True,
                                        "why": f"the weight inputs together qualify ({base['promised']:.4f})"}
    else:
        chosen, order = [], weights + others
        decision["nothing_quantized"] = measure([])
        if decision["nothing_quantized"]["promised"] < min_cosine:
            order = []  # not even the graph with no activation quantized qualifies: nothing will
    alone = {name: measure([*chosen, name]) for name in order}
    order = sorted(order, key=lambda n: (groups[n]["kind"] != "weights", -alone[n]["promised"]))
    for name in order:
        entry: Dict[str, Any] = {"kind": groups[name]["kind"], "alone": alone[name]}
        with_it = measure([*chosen, name]) if alone[name]["promised"] >= min_cosine else alone[name]
        if with_it["promised"] >= min_cosine:
            chosen.append(name)
            entry.update(quantized=True, why=f"promised cosine with it {with_it['promised']:.4f} >= {min_cosine:g}")
        else:
            entry.update(quantized=False, why=f"kept fp32: quantizing it takes the promised cosine to "
                                              f"{with_it['promised']:.4f} < {min_cosine:g}")
        decision["groups"][name] = entry
    final = decision["chosen"] = measure(chosen)
    decision["promised"] = bool(chosen) and final["promised"] >= min_cosine
    if not decision["promised"]:  # nothing qualifies: the weight MatMuls alone (refused unless the gate is 0)
        chosen = list(weights)
        decision["fallback"] = "no placement qualifies: the weight inputs alone quantized"
        for name, g in groups.items():
            entry = decision["groups"].setdefault(name, {"kind": g["kind"], "why": decision["fallback"]})
            entry["quantized"] = name in weights
            if name in weights:
                entry["why"] = decision["fallback"]
        decision["chosen"] = measure(chosen)
    return _without(proto, groups, [g for g in groups if g not in chosen]), decision


def group_speed(chosen: onnx.ModelProto, full: onnx.ModelProto, decision: Mapping[str, Any], x: np.ndarray, *,
                runs: int = SPEED_RUNS, fixed: Sequence[str] = ()) -> Dict[str, Any]:
    """What each group ``auto`` kept fp32 costs in speed here: ONNX Runtime CPU, one thread, batch 1, the chosen
    graph against the chosen graph with that group quantized too, ``runs`` runs of each interleaved, the fastest
    of each (the run least disturbed by other work on the machine). ``slowdown`` > 1: the group in fp32 is slower
    on this CPU.

    Returns:
        ``{"runtime", "batch", "runs", "chosen_ms", "groups": {group: {"fp32_ms", "quantized_ms", "slowdown"}}}``.
    """
    from attnzoo.runtime.evaluate import cpu_session

    groups = qdq_groups(full, fixed)
    kept = [g for g, d in decision["groups"].items() if not d["quantized"] and g in groups]
    quantized = [g for g, d in decision["groups"].items() if d["quantized"]]
    one = np.ascontiguousarray(x[:1])
    base = cpu_session(chosen, 1)
    name = base.get_inputs()[0].name

    def timed(sess) -> float:
        start = time.perf_counter()
        sess.run(None, {name: one})
        return (time.perf_counter() - start) * 1e3

    base.run(None, {name: one})
    result: Dict[str, Any] = {"runtime": "onnxruntime CPUExecutionProvider, 1 thread", "batch": 1, "runs": runs,
                              "statistic": "fastest of the interleaved runs",
                              "groups": {}}
    mine: List[float] = []
    for group in kept:
        other = cpu_session(_without(full, groups, [g for g in groups if g not in {*quantized, group}]), 1)
        other.run(None, {name: one})
        pairs = [(timed(base), timed(other)) for _ in range(runs)]
        a, b = np.array(pairs).T
        mine.extend(a)
        result["groups"][group] = {"fp32_ms": float(a.min()), "quantized_ms": float(b.min()),
                                   "slowdown": float(a.min() / b.min())}
    result["chosen_ms"] = float(min(mine)) if mine else None
    return result


def quantize_onnx(fp32_onnx: Union[str, Path], out: Union[str, Path], *, dtype: str, calibration: np.ndarray,
                  exclude_nodes: Sequence[str] = (), calibration_method: Optional[str] = None,
                  calibration_source: str = "given array", calibration_seed: Optional[int] = None,
                  extra_nodes: Optional[Sequence[str]] = None,
                  placement: str = TENSORRT_QDQ_PLACEMENT) -> QuantizeReport:
    """Quantize an fp32 attnzoo export with ModelOpt; write the Q/DQ graph to ``out`` (temp + rename).

    The attnzoo metadata is carried over, with ``dtype`` set to ``int8``/``fp8`` and a ``quantization`` entry
    (JSON: quantizer, version, mode, calibration, excluded node count). Everything not quantized stays fp32
    (``high_precision_dtype="fp32"``). ``out`` is not verified here: see :func:`quantize_verified`.

    Args:
        fp32_onnx: The verified fp32 ONNX file.
        out: Output ``.onnx`` path.
        dtype: ``int8`` or ``fp8``.
        calibration: float32 NCHW inputs (normalised), e.g. :func:`calibration_images`.
        exclude_nodes: Exact node names ModelOpt must leave unquantized (:func:`extra_math_nodes`).
        calibration_method: ModelOpt's (``entropy``, ``max``); default :data:`CALIBRATION_METHODS`.
        calibration_source, calibration_seed: Recorded in the report.
        extra_nodes: Extra-math nodes for :func:`qdq_summary` (default: :func:`extra_math_nodes` of the graph).
        placement: One of ModelOpt's :data:`QDQ_PLACEMENTS` (``cpu``: int8 only); ``auto`` is chosen by
            :func:`quantize_verified`, which measures.

    Raises:
        ValueError: unknown dtype or placement, calibration not float32 NCHW or empty.
    """
    from attnzoo.fileio import atomic_path

    if dtype not in QUANTIZED_DTYPES:
        raise ValueError(f"unknown quantized dtype {dtype!r}; valid: {', '.join(QUANTIZED_DTYPES)}")
    placement_error = qdq_placement_error(placement, dtype)
    if placement_error or placement not in QDQ_PLACEMENTS:
        raise ValueError(placement_error or f"the {placement} placement is measured by quantize_verified; "
                                            f"quantize_onnx places {', '.join(QDQ_PLACEMENTS)}")
    calibration = np.asarray(calibration)
    if calibration.ndim != 4 or calibration.shape[0] == 0 or calibration.dtype != np.float32:
        raise ValueError(f"calibration must be a non-empty float32 (N, 3, H, W) array, got {calibration.dtype} "
                         f"{calibration.shape}")
    fp32_onnx, out = Path(fp32_onnx), Path(out)
    method = calibration_method or CALIBRATION_METHODS[dtype]
    src = onnx.load(str(fp32_onnx))
    extra = list(extra_nodes) if extra_nodes is not None else extra_math_nodes(src)
    with contextlib.redirect_stdout(io.StringIO()):
        from modelopt.onnx.quantization import quantize as mo_quantize
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnzoo-quantize-") as work, atomic_path(out) as tmp:
        staged = Path(work) / "model.onnx"
        onnx.save(src, str(staged))
        quantized = Path(work) / "model.quant.onnx"
        # the ORT calibrator prints a line and a progress bar per batch: export-model's own bar stands for them
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            mo_quantize(str(staged), quantize_mode=dtype, calibration_data=calibration, calibration_method=method,
                        calibration_eps=["cpu"], nodes_to_exclude=[f"^{re.escape(n)}$" for n in exclude_nodes] or None,
                        high_precision_dtype="fp32", output_path=str(quantized), log_level="ERROR",
                        **QDQ_PLACEMENTS[placement])
        elapsed = time.perf_counter() - start
        proto = onnx.load(str(quantized))
        rerouted = _reroute_extra_math(proto, exclude_nodes)
        report = QuantizeReport(
            quantizer="nvidia-modelopt (modelopt.onnx.quantization.quantize)",
            quantizer_version=modelopt_version() or "?", mode=dtype,
            calibration={"source": calibration_source, "count": int(calibration.shape[0]), "seed": calibration_seed,
                         "shape": list(calibration.shape[1:]), "method": method, "providers": ["cpu"]},
            excluded_nodes=list(exclude_nodes), qdq=qdq_summary(proto, extra), time_s=round(elapsed, 3),
            options={"high_precision_dtype": "fp32", "calibration_eps": ["cpu"], "placement": placement,
                     **QDQ_PLACEMENTS[placement]},
            extra_math_inputs_unquantized=rerouted)
        _carry_metadata(src, proto, dtype, report, quantize_extra_math=bool(set(extra) - set(exclude_nodes)))
        onnx.save(proto, str(tmp))
    return report


def _carry_metadata(src: onnx.ModelProto, dst: onnx.ModelProto, dtype: str, report: QuantizeReport, *,
                    quantize_extra_math: bool) -> None:
    """Copy the attnzoo metadata props; ``dtype`` becomes the quantized one; add ``quantization``."""
    props = {p.key: p.value for p in src.metadata_props}
    props["dtype"] = dtype
    props["quantization"] = json.dumps({"quantizer": report.quantizer, "version": report.quantizer_version,
                                        "mode": dtype, "calibration": report.calibration,
                                        "excluded_nodes": len(report.excluded_nodes),
                                        "placement": report.options["placement"],
                                        "quantize_extra_math": quantize_extra_math})
    del dst.metadata_props[:]
    for key, value in props.items():
        dst.metadata_props.add(key=key, value=value)


# ------------------------------------------------------------------------------------------------ FP8 simulation
def simulate_fp8(proto: onnx.ModelProto) -> onnx.ModelProto:
    """ModelOpt's FP8 Q/DQ graph rewritten into float ops that ONNX Runtime's CPU provider runs.

    Every ``QuantizeLinear(x, s, zp: float8e4m3fn)`` becomes ``Cast(Cast(x / s, to=FLOAT8E4M3FN, saturate=1),
    to=FLOAT)``: the values QuantizeLinear produces (round to nearest even on the e4m3 grid, saturating at
    +-448), held in float32; the layout ops between Q and DQ (Transpose) then move the same values; every
    ``DequantizeLinear(q, s, zp: float8)`` becomes ``q * s`` (an fp8 zero point is 0). Same points, same
    scales (a per-channel scale broadcast along the node's ``axis``); only the storage type of the quantized
    tensors differs.

    Raises:
        ValueError: a float8 Q/DQ with a non-constant scale, a non-zero zero point, or a per-channel scale on a
            tensor of unknown rank.
    """
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    inits = {t.name: t for t in proto.graph.initializer}
    consts = {n.output[0]: n.attribute[0].t for n in proto.graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}

    def tensor(name: str) -> Optional[onnx.TensorProto]:
        return inits.get(name) or consts.get(name)

    def is_fp8(node: onnx.NodeProto) -> bool:
        zp = tensor(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        return zp is not None and zp.data_type in _FP8_TYPES

    ranks: Dict[str, int] = {t.name: len(t.dims) for t in proto.graph.initializer}
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
        for v in (*inferred.value_info, *inferred.input, *inferred.output):
            if v.type.tensor_type.HasField("shape"):
                ranks.setdefault(v.name, len(v.type.tensor_type.shape.dim))
    except Exception:  # noqa: BLE001 - ranks are only needed for per-channel scales; refused below if unknown
        pass
    nodes: List[onnx.NodeProto] = []
    for node in proto.graph.node:
        if not (node.op_type in _QDQ and is_fp8(node)):
            nodes.append(node)
            continue
        zp = numpy_helper.to_array(tensor(node.input[2])).astype(np.float32)
        scale_t = tensor(node.input[1])
        if scale_t is None or np.any(zp != 0):
            raise ValueError(f"{node.name}: FP8 simulation needs a constant scale and zero point 0")
        x, s, y = node.input[0], node.input[1], node.output[0]
        scale = numpy_helper.to_array(scale_t).astype(np.float32)
        if scale.size != 1:  # per-channel: broadcast the scale along the node's axis
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            rank = ranks.get(x)
            if rank is None or scale.ndim != 1:
                raise ValueError(f"{node.name}: per-channel FP8 scale on a tensor of unknown rank")
            shape = [1] * rank
            shape[axis % rank] = scale.size
            s = f"{s}__sim_axis{axis % rank}_rank{rank}"
            if s not in inits:
                inits[s] = numpy_helper.from_array(scale.reshape(shape), s)
                proto.graph.initializer.append(inits[s])
        if node.op_type == "QuantizeLinear":
            nodes += [helper.make_node("Div", [x, s], [f"{y}__sim_div"], name=f"{node.name}__sim_div"),
                      helper.make_node("Cast", [f"{y}__sim_div"], [f"{y}__sim_fp8"], to=TensorProto.FLOAT8E4M3FN,
                                       saturate=1, name=f"{node.name}__sim_round"),
                      helper.make_node("Cast", [f"{y}__sim_fp8"], [y], to=TensorProto.FLOAT,
                                       name=f"{node.name}__sim_float")]
            ranks[y] = ranks.get(x, -1)
        else:
            nodes.append(helper.make_node("Mul", [x, s], [y], name=f"{node.name}__sim_scale"))
    # float8 tensors between Q and DQ (Transpose outputs) are float32 now: drop their stale value_info types
    keep = [v for v in proto.graph.value_info if v.type.tensor_type.elem_type not in _FP8_TYPES]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(keep)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    used = {i for n in proto.graph.node for i in n.input}
    stale = [t for t in proto.graph.initializer if t.data_type in _FP8_TYPES and t.name not in used]
    for t in stale:
        proto.graph.initializer.remove(t)
    return proto


# ------------------------------------------------------------------------------------------------ evaluation
def evaluate_onnx(models: Mapping[str, Union[str, Path, onnx.ModelProto]], config: Mapping[str, Any], *,
                  limit: Optional[int] = None, threads: Optional[int] = None,
                  progress: bool = False) -> Dict[str, Any]:
    """Score ONNX models on the model's test split with ONNX Runtime (CPU), all on the same images.

    Classifiers: top-1 on the test split (Fashion-MNIST: the official 10,000 test images); segmenters: mIoU on
    the test scenes. Data loading, preprocessing and metrics are the training code's
    (:func:`attnzoo.data.datasets.load_data`, :func:`attnzoo.preprocess.normalize`,
    :func:`attnzoo.metrics.metrics_from_confusion`); predictions come from
    :func:`attnzoo.runtime.evaluate.predict_session`, which refuses non-finite logits.

    Args:
        models: ``{label: ONNX file or proto}``, e.g. ``{"fp32": ..., "int8": ...}``.
        config: The model config (``data``, ``task``, ``img_size``, ``data_seed``, ``mean``, ``std``).
        limit: First ``limit`` test images only (default: the whole split).

    Returns:
        ``{"data", "split": "test", "n_images", "metric_name", "metrics": {label: percent},
        "agreement": {label: share of predictions equal to the first model's}}``.
    """
    import torch
    from tqdm import tqdm

    from attnzoo.runtime.evaluate import EVAL_BATCH, cpu_session, predict_session
    from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
    from attnzoo.data.datasets import load_data
    from attnzoo.metrics import confusion_matrix, metrics_from_confusion

    task, size = config["task"], int(config["img_size"])
    data = load_data(config["data"], "test", task, size, n=limit, seed=int(config.get("data_seed", 0)),
                     scene=config.get("scene"))
    x = normalize(data.images, config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))
    y = data.labels if task == "cls" else data.masks.astype(np.int64)
    k = len(data.class_names)
    metrics, preds, name = {}, {}, "top1"
    for label, model in tqdm(list(models.items()), desc="test-set accuracy", unit="model", disable=not progress):
        pred = predict_session(cpu_session(model, threads), x, EVAL_BATCH)
        m = metrics_from_confusion(confusion_matrix(y, pred, k), task, data.class_names)
        metrics[label], name, preds[label] = float(m["metric"]), m["metric_name"], pred
    first = next(iter(preds.values()))
    return {"data": config["data"], "split": "test", "n_images": len(data), "metric_name": name,
            "metrics": metrics, "agreement": {k_: float(np.mean(p == first)) for k_, p in preds.items()}}


def _finite_outputs(model: Union[Path, onnx.ModelProto], x: np.ndarray, threads: Optional[int]) -> bool:
    from attnzoo.runtime.evaluate import cpu_session

    sess = cpu_session(model, threads)
    out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return bool(np.isfinite(out).all())


# ------------------------------------------------------------------------------------------------ the export
def quantize_verified(fp32_onnx: Union[str, Path], out: Union[str, Path], config: Mapping[str, Any], *, dtype: str,
                      calibration: np.ndarray, calibration_source: str, calibration_seed: Optional[int] = None,
                      quantize_extra_math: bool = False, accept_accuracy_drop: bool = False,
                      measure_accuracy: bool = True, eval_limit: Optional[int] = None,
                      threads: Optional[int] = None, progress: bool = False,
                      tolerance: Optional[float] = None, fp32_kept: bool = True,
                      placement: str = DEFAULT_QDQ_PLACEMENT, held_out: Optional[np.ndarray] = None,
                      min_cosine: Optional[float] = None, calibration_random: bool = False,
                      warnings: Sequence[str] = ()) -> Dict[str, Any]:
    """Quantize a verified fp32 export, check it, measure its fidelity to fp32 and score it, and only then write it.

    Writes ``out`` and its report ``<out>.report.json`` (:func:`attnzoo.export.verify.report_path`) when every
    check passes; otherwise writes ``<out>.failed.report.json`` and raises, leaving a good model and report
    already at ``out`` untouched. Nothing is half-written: the model goes through a temporary file renamed into
    place, also on Ctrl-C.

    Fidelity (every model): the outputs of the quantized graph and of the fp32 graph on held-out inputs
    (:func:`output_agreement`); a worst input below ``min_cosine`` refuses the graph (:class:`FidelityError`),
    naming the figure and what the weights-only placement measures. With ``placement="auto"`` half of the held-out
    inputs choose the placement with a margin (:func:`auto_placement`) and the other half are the gate's; when no
    placement promises ``min_cosine`` on the choosing inputs the graph is refused too. The report states the
    split, marks a gate of fewer than :data:`FIRM_GATE_INPUTS` inputs as weak, and says what each group ``auto``
    kept fp32 costs in speed here (:func:`group_speed`, int8).

    Args:
        fp32_onnx: The verified fp32 export (its report beside it is referenced).
        out: The quantized ``.onnx`` to write.
        config: The model config.
        dtype: ``int8`` or ``fp8``.
        calibration: float32 NCHW calibration inputs.
        calibration_source: What they are, for the report (e.g. ``fashion training split``).
        quantize_extra_math: Quantize the extra-math scopes too (the ablation); default: excluded, fp32.
        accept_accuracy_drop: Write even when the drop exceeds the tolerance (the report says so).
        measure_accuracy: ``False`` for a model without a labelled test split (``--random-init``, a converted
            pretrained model): no accuracy, the fidelity gate only.
        eval_limit: Score on the first N test images only (quick checks; the report names N).
        tolerance: Accepted drop in points (default :data:`ACCURACY_TOLERANCE` for the task).
        fp32_kept: ``False`` when ``fp32_onnx`` is a temporary file (``export-model --dtype int8``): the report
            records its SHA-256 and verification report, not a path that will not exist.
        placement: :data:`PLACEMENT_CHOICES`: ``auto`` (measured), ``tensorrt`` (ModelOpt's) or ``cpu`` (int8 for
            ONNX Runtime on the CPU).
        held_out: Inputs of the calibration source never calibrated on (default: held-out training images of
            the model's data set, else the last quarter of ``calibration``, at most :data:`DEFAULT_FIDELITY_COUNT`,
            which then is not calibrated on).
        min_cosine: The fidelity gate on the worst held-out input's cosine (0 measures without refusing, and
            ``auto`` then aims at :data:`DEFAULT_MIN_COSINE`). Default: :data:`DEFAULT_MIN_COSINE` for a model
            without a labelled test split; 0 for one scored on its test split, which the accuracy gate decides (a
            classifier's logits can drift on a few inputs without changing a prediction).
        calibration_random: The calibration inputs are random, not images (the report warns for a trained model).
        warnings: Other warnings for the report.

    Raises:
        QuantizationCheckError: Q/DQ in the extra math (unless asked for), no quantized op, non-finite outputs.
        FidelityError: the worst output cosine to fp32 on the gate's held-out inputs is below ``min_cosine``, or
            (``auto``) no placement promises it on the choosing inputs.
        AccuracyDropError: the accuracy drop exceeds the tolerance.
    """
    from attnzoo.fileio import atomic_path, atomic_write_text, sha256_file

    from .check import check_extra_math
    from .onnx_export import BATCH_DIM, op_histogram
    from .verify import failed_report_path, report_path

    fp32_onnx, out = Path(fp32_onnx), Path(out)
    error = qdq_placement_error(placement, dtype)
    if error:
        raise ValueError(error)
    src = onnx.load(str(fp32_onnx))
    extra = extra_math_nodes(src, config)
    exclude = [] if quantize_extra_math else extra
    tol = ACCURACY_TOLERANCE[config["task"]] if tolerance is None else float(tolerance)
    gate = (0.0 if measure_accuracy else DEFAULT_MIN_COSINE) if min_cosine is None else float(min_cosine)
    notes = list(warnings)
    calibration, held_out, held_source = _held_out(config, calibration, calibration_seed, held_out,
                                                   calibration_source)
    if calibration_random and not config.get("untrained"):
        notes.append("a trained model calibrated on random inputs: real inputs' activations differ")
    choose, check = (held_out[: len(held_out) // 2], held_out[len(held_out) // 2:]) \
        if placement == AUTO_QDQ_PLACEMENT and len(held_out) >= 2 else (held_out[:0], held_out)
    run = simulate_fp8 if dtype == "fp8" else (lambda p: p)
    with atomic_path(out) as tmp:
        q = quantize_onnx(fp32_onnx, tmp, dtype=dtype, calibration=calibration, exclude_nodes=exclude,
                          calibration_source=calibration_source, calibration_seed=calibration_seed,
                          extra_nodes=extra, placement=TENSORRT_QDQ_PLACEMENT if placement == AUTO_QDQ_PLACEMENT
                          else placement)
        proto = onnx.load(str(tmp))
        decision: Dict[str, Any] = {}
        if placement == AUTO_QDQ_PLACEMENT:
            full = proto
            proto, decision = auto_placement(proto, onnx_outputs(fp32_onnx, choose, threads), choose, config["task"],
                                             min_cosine=gate or DEFAULT_MIN_COSINE, runnable=run, threads=threads,
                                             fixed=extra if quantize_extra_math else ()) if len(choose) else \
                (proto, {"selection_inputs": 0, "promised": False,
                         "note": "too few held-out inputs to choose: ModelOpt's full placement"})
            if dtype == "int8" and any(not d["quantized"] for d in decision.get("groups", {}).values()):
                decision["speed"] = group_speed(proto, full, decision, check,
                                                fixed=extra if quantize_extra_math else ())
            q.options.update(placement=AUTO_QDQ_PLACEMENT, auto=decision)
            q.qdq = qdq_summary(proto, extra)
            _set_placement(proto, AUTO_QDQ_PLACEMENT)
            onnx.save(proto, str(tmp))
        runnable = run(proto)
        failures: List[str] = []
        unpromised = placement == AUTO_QDQ_PLACEMENT and gate > 0 and not decision.get("promised")
        if unpromised:  # checked first: the graph auto fell back to may hold no int8 op at all
            named = {"ModelOpt's full placement": "all_quantized", "the weight MatMuls alone": "weights_only",
                     "the best choice": "chosen"}
            tried = {label: decision[key] for label, key in named.items() if key in decision}
            best = max(tried, key=lambda label: tried[label]["promised"], default=None)
            failures.append(f"no Q/DQ placement promises a cosine to fp32 >= {gate:g} on inputs like the {len(choose)} "
                            f"choosing one(s)" + (f" ({best} promises {tried[best]['promised']:.4f}, worst "
                                                  f"{tried[best]['worst']:.4f})" if best else "")
                            + "; calibrate on more images like the model's inputs (--calibration-data DIR) or lower "
                            "--min-cosine")
        qdq = q.qdq
        if not unpromised and sum(qdq["quantized_ops"].values()) == 0:
            failures.append("no MatMul/Gemm/Conv was quantized")
        if not quantize_extra_math and qdq["extra_math_quantized"]:
            failures.append(f"{len(qdq['extra_math_quantized'])} extra-math op(s) read quantized values, e.g. "
                            f"{qdq['extra_math_quantized'][0]}")
        extra_check = check_extra_math(proto, dict(config), "fp32")
        failures += [f"extra math: {f}" for f in extra_check["failures"]] if not quantize_extra_math else []
        if not _finite_outputs(runnable, calibration[: min(8, len(calibration))], threads):
            failures.append("non-finite outputs on calibration inputs")
        dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
        if (dim.dim_param or dim.dim_value) != BATCH_DIM:
            failures.append(f"input batch dimension is {dim.dim_param or dim.dim_value!r}, not {BATCH_DIM!r}")
        fidelity = None
        if len(failures) == int(unpromised):  # the other checks passed: measured, also to say why auto refused
            fidelity = _fidelity(proto, runnable, fp32_onnx, check, config["task"], gate, placement, run, threads)
            fidelity.update(source=held_source, warnings=notes, split={
                "calibration": int(len(calibration)), "choose": int(len(choose)), "gate": int(len(check))})
            if len(check) < FIRM_GATE_INPUTS:
                fidelity["weak"] = (f"only {len(check)} gate input(s) (firm from {FIRM_GATE_INPUTS}): a further input "
                                    f"falls below their worst with probability about 1/{len(check) + 1}")
            if not fidelity["within_gate"] and not unpromised:
                failures.append(fidelity["failure"])
        too_low = False
        accuracy: Dict[str, Any]
        if measure_accuracy and not failures:
            ev = evaluate_onnx({"fp32": fp32_onnx, dtype: runnable}, config, limit=eval_limit, threads=threads,
                               progress=progress)
            drop = ev["metrics"]["fp32"] - ev["metrics"][dtype]
            accuracy = {**ev, "limit": eval_limit, "drop": drop, "tolerance": tol, "within_tolerance": drop <= tol,
                        "accepted_drop": bool(accept_accuracy_drop and drop > tol),
                        "runtime": "onnxruntime CPUExecutionProvider",
                        "how": ("the FP8 Q/DQ graph simulated in float ops (simulate_fp8: e4m3 RNE round trip at the "
                                "same Q/DQ points, same scales); ONNX Runtime's CPU provider refuses float8 tensors "
                                "into Transpose") if dtype == "fp8" else "the Q/DQ graph itself"}
            too_low = drop > tol and not accept_accuracy_drop
            if too_low:
                failures.append(f"{ev['metric_name']} {ev['metrics'][dtype]:.2f} is {drop:.2f} points below fp32's "
                                f"{ev['metrics']['fp32']:.2f} (tolerance {tol:g}); pass --accept-accuracy-drop to "
                                "write it anyway")
        elif not measure_accuracy:
            accuracy = {"measured": False, "warning": "no labelled test split (an untrained or converted model): "
                                                      "accuracy not measured; the fidelity to fp32 is"}
        else:
            accuracy = {"measured": False, "reason": "checks failed before scoring"}
        fp32_report = report_path(fp32_onnx)
        report = {
            "path": str(out), "variant": config["variant"], "task": config["task"], "arch": config["arch"],
            "dtype": dtype, "fp32_source": {"path": str(fp32_onnx) if fp32_kept else None, "kept": fp32_kept,
                                            "sha256": sha256_file(fp32_onnx),
                                            "report": json.loads(fp32_report.read_text())
                                            if fp32_report.is_file() else None},
            "quantization": q.to_dict(), "quantize_extra_math": quantize_extra_math,
            "extra_math_scope_check": {"nodes": len(extra), "quantized": qdq["extra_math_quantized"],
                                       "checker": extra_check["ok"] or extra_check["failures"]},
            "fidelity": fidelity, "accuracy": accuracy, "warnings": notes, "file_size": tmp.stat().st_size,
            "sha256": sha256_file(tmp), "num_nodes": len(proto.graph.node), "op_histogram": op_histogram(proto),
            "batch_dim": BATCH_DIM, "onnxruntime": __import__("onnxruntime").__version__,
            "verified": "quantized graph checked (Q/DQ placement, extra math fp32), its output compared with fp32's "
                        "on held-out inputs" + (" and scored with ONNX Runtime CPU on the test split next to fp32"
                                                if measure_accuracy else ""),
        }
        report.update(passed=not failures, failures=failures)
        if failures:
            atomic_write_text(failed_report_path(out), json.dumps(report, indent=2) + "\n")
            kind = AccuracyDropError if too_low else FidelityError if unpromised or (
                fidelity and not fidelity["within_gate"]) else QuantizationCheckError
            raise kind(f"{out.name} not written: {'; '.join(failures[:3])}; see {failed_report_path(out)}")
    # the report after the model: stopped in between, the old report names another SHA-256 and nothing serves it
    atomic_write_text(report_path(out), json.dumps(report, indent=2) + "\n")
    failed_report_path(out).unlink(missing_ok=True)
    return report


def _held_out(config: Mapping[str, Any], calibration: np.ndarray, seed: Optional[int],
              held_out: Optional[np.ndarray], source: str) -> Tuple[np.ndarray, np.ndarray, str]:
    """``(calibration, held-out inputs, what they are)``: the given ones, held-out training images, or the last
    part of the calibration batch (then not calibrated on)."""
    if held_out is not None:
        if len(held_out) == 0:
            raise ValueError("held_out holds no inputs")
        return calibration, np.ascontiguousarray(held_out, dtype=np.float32), f"held out of {source}"
    if config.get("data") and not config.get("untrained"):
        images = heldout_images(config, DEFAULT_FIDELITY_COUNT, len(calibration), seed or 0)
        if images.shape[1:] == calibration.shape[1:]:
            return calibration, images, f"{config['data']} training images outside the calibration draw"
    calibration, held = _split(calibration, DEFAULT_FIDELITY_COUNT, "calibration")
    return calibration, held, f"the last {len(held)} of the calibration inputs ({source}), not calibrated on"


def _set_placement(proto: onnx.ModelProto, placement: str) -> None:
    """Record ``placement`` in the graph's ``quantization`` metadata."""
    for prop in proto.metadata_props:
        if prop.key == "quantization":
            prop.value = json.dumps({**json.loads(prop.value), "placement": placement})


def _fidelity(proto: onnx.ModelProto, runnable: onnx.ModelProto, fp32_onnx: Path, x: np.ndarray, task: str,
              gate: float, placement: str, run, threads: Optional[int]) -> Dict[str, Any]:
    """The gate's measurement on ``x``; below the gate, also what the weights-only placement measures there."""
    reference = onnx_outputs(fp32_onnx, x, threads)
    result = {**output_agreement(reference, onnx_outputs(runnable, x, threads), task), "min_cosine": gate,
              "runtime": "onnxruntime CPUExecutionProvider"}
    result["gate_on"] = "worst held-out input" if gate > 0 else "not gated (--min-cosine 0, or a labelled model: " \
        "its test-split accuracy decides)"
    result["within_gate"] = bool(result["finite"] and result["cosine"]["min"] >= gate)
    if result["within_gate"]:
        return result
    groups = qdq_groups(proto)
    hint = ""
    if groups:
        weights = _without(proto, groups, [g for g in groups if groups[g]["kind"] != "weights"])
        alt = output_agreement(reference, onnx_outputs(run(weights), x, threads), task)["cosine"]["min"]
        result["weights_only_worst"] = alt
        hint = f"; the weight MatMuls alone: worst {alt:.4f}" + (
            f" (--qdq-placement {AUTO_QDQ_PLACEMENT} quantizes only what promises the gate)"
            if alt >= gate and placement != AUTO_QDQ_PLACEMENT else ", also below: calibrate on images like the "
            "model's inputs (--calibration-data DIR)" if alt < gate else "")
    result["failure"] = (f"worst output cosine to fp32 {result['cosine']['min']:.4f} (mean {result['cosine']['mean']:.4f}) "
                         f"on {len(x)} held-out input(s) is below --min-cosine {gate:g} (Q/DQ placement {placement})"
                         f"{hint}")
    return result


def summary(report: Mapping[str, Any]) -> str:
    """A few lines for the terminal."""
    q = report["quantization"]
    cal = q["calibration"]
    ops = ", ".join(f"{n}/{report['quantization']['qdq']['total_ops'][op]} {op}"
                    for op, n in q["qdq"]["quantized_ops"].items() if report["quantization"]["qdq"]["total_ops"][op])
    lines = [f"{report['path']}: {report['variant']} {report['task']} {report['arch']} {report['dtype']} "
             f"({q['quantizer']} {q['quantizer_version']}), {report['file_size'] / 1e6:.2f} MB",
             f"  calibration: {cal['count']} x {cal['source']} (seed {cal['seed']}), {cal['method']}; quantized: {ops} "
             f"(Q/DQ placement {q['options']['placement']})",
             "  extra math: " + (f"{report['extra_math_scope_check']['nodes']} node(s) " + (
                 "QUANTIZED (--quantize-extra-math)" if report["quantize_extra_math"] else "excluded, fp32, no Q/DQ")
                 if report["extra_math_scope_check"]["nodes"] else "none declared for this variant: nothing excluded")]
    auto = q["options"].get("auto")
    if auto and auto.get("groups"):
        kept = [g for g, d in auto["groups"].items() if not d["quantized"]]
        speed = (auto.get("speed") or {}).get("groups", {})
        named = [f"{g} ({speed[g]['slowdown']:.2f}x)" if g in speed else g for g in kept]
        chosen = auto.get("chosen", {})
        lines.append(f"  auto placement: {len(auto['groups']) - len(kept)} of {len(auto['groups'])} Q/DQ groups quantized, "
                     f"promised cosine {chosen.get('promised', 0.0):.4f} on {auto['selection_inputs']} choosing inputs"
                     + (f"; kept fp32 (time in fp32 / quantized, ONNX Runtime CPU): {', '.join(named)}" if kept else ""))
    fid = report.get("fidelity")
    if fid:
        split = fid.get("split", {})
        chose = f", {split['choose']} others chose the placement" if split.get("choose") else ""
        line = (f"  fidelity to fp32 on {fid['n_inputs']} held-out inputs ({split.get('calibration', '?')} calibrate"
                f"{chose}): cosine worst "
                f"{fid['cosine']['min']:.4f} (gate {fid['min_cosine']:g}), mean {fid['cosine']['mean']:.4f}; relative "
                f"error mean {fid['relative_error']['mean']:.3f}, max {fid['relative_error']['max']:.3f}; top-1 "
                f"agreement {fid['top1_agreement']:.1%}")
        line += f", top-5 overlap {fid['top5_overlap']:.1%}" if "top5_overlap" in fid else ""
        lines.append(line + (f" [WEAK: {fid['weak']}]" if fid.get("weak") else ""))
    for warning in report.get("warnings", []):
        lines.append(f"  warning: {warning}")
    acc = report["accuracy"]
    if acc.get("metrics"):
        m = acc["metrics"]
        unit = "images" if report["task"] == "cls" else "scenes"
        lines.append(f"  {acc['metric_name']} on {acc['n_images']} {acc['data']} test {unit}: fp32 {m['fp32']:.2f}, "
                     f"{report['dtype']} {m[report['dtype']]:.2f} (drop {acc['drop']:+.2f}, tolerance {acc['tolerance']:g})"
                     + (" [FP8 simulated]" if report["dtype"] == "fp8" else ""))
    else:
        lines.append(f"  accuracy not measured: {acc.get('warning') or acc.get('reason')}")
    lines.append(f"  {'PASSED' if report['passed'] else 'FAILED: ' + '; '.join(report['failures'])}")
    return "\n".join(lines)
