"""``--format triton``: a Triton model repository folder from the verified ONNX (:mod:`.config`):
``<name>/config.pbtxt``, ``labels.txt`` and ``1/model.onnx``, or ``1/model.plan``, an engine built by the TensorRT
target's engine step (``--triton-platform tensorrt``), with the options ``--triton-platform`` and
``--triton-queue-delay-us``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnzoo.errors import UsageError, install_hint
from attnzoo.export.formats import ExportFormat, ExportRequest, FormatOption, Step
from attnzoo.fileio import writable_dir
from attnzoo.runtime.contract import ModelContract
from attnzoo.targets.tensorrt import engine_step, gpu_available, load_library
from attnzoo.targets.tensorrt.options import COMPUTE_CAPABILITY

from .config import DEFAULT_QUEUE_DELAY_US, LABELS_FILE, MODEL_FILES, PLATFORMS, triton_unavailable_reason, write_config
from .config import summary as triton_summary
from .schema import TritonConfigCheck

__all__ = [
    "TritonFormat",
    "TritonPlatform",
    "TRITON_PLATFORMS",
    "FORMAT",
    "DEFAULT_TRITON_DIR",
    "PLATFORM",
    "QUEUE_DELAY_US",
]

#: ``format="triton"`` without ``out``.
DEFAULT_TRITON_DIR = Path("triton-models")


@dataclass(frozen=True)
class TritonPlatform:
    """One ``--triton-platform``: the Triton platform the model's folder is written for.

    Attributes:
        name: The ``--triton-platform`` choice (a key of :data:`~attnzoo.targets.triton.config.PLATFORMS`).
        platform: Triton's platform name in ``config.pbtxt``.
        engine_library: The TensorRT library whose engines the platform loads (an engine built here from the
            verified ONNX is its model file); ``None``: it serves the ONNX itself.
    """

    name: str
    platform: str
    engine_library: str | None = None

    @property
    def builds_engine(self) -> bool:
        """Its model file is a TensorRT engine built from the verified ONNX, which stays beside ``1/``."""
        return self.engine_library is not None

    @property
    def model_file(self) -> str:
        """Triton's default model file name in the version folder."""
        return MODEL_FILES[self.platform]


#: Every ``--triton-platform`` by name, in :data:`~attnzoo.targets.triton.config.PLATFORMS`'s order.
TRITON_PLATFORMS: dict[str, TritonPlatform] = {
    p.name: p
    for p in (
        TritonPlatform("onnxruntime", PLATFORMS["onnxruntime"]),
        TritonPlatform("tensorrt", PLATFORMS["tensorrt"], engine_library="tensorrt"),
    )
}
#: ``--triton-platform`` and ``--triton-queue-delay-us``: the Triton target's options.
PLATFORM = FormatOption(
    "triton_platform",
    owner="triton",
    help="--format triton: onnxruntime (platform onnxruntime_onnx, default) or tensorrt (tensorrt_plan: an engine "
    "of TensorRT proper, built on the GPU it will serve on); max_batch_size is the largest of --batch-sizes",
    default="onnxruntime",
    choices=tuple(TRITON_PLATFORMS),
    title="Triton platform",
)
QUEUE_DELAY_US = FormatOption(
    "triton_queue_delay_us",
    owner="triton",
    help=f"--format triton: dynamic batching's max_queue_delay_microseconds (default {DEFAULT_QUEUE_DELAY_US})",
    default=DEFAULT_QUEUE_DELAY_US,
    kind=int,
    metavar="US",
)


class TritonFormat(ExportFormat):
    """The model's folder in a Triton model repository (``--out``, default :data:`DEFAULT_TRITON_DIR`)."""

    name = "triton"
    title = "model repository"
    suffixes = ()
    options = (PLATFORM, QUEUE_DELAY_US, COMPUTE_CAPABILITY)

    def check(self, req: ExportRequest) -> None:
        platform = self._platform(req)
        reason = triton_unavailable_reason()
        if reason:
            raise UsageError(f"--format triton: {reason}")
        if req.option(QUEUE_DELAY_US) < 0:
            raise UsageError(f"--triton-queue-delay-us must be >= 0, got {req.option(QUEUE_DELAY_US)}")
        if not platform.builds_engine:
            if req.option(COMPUTE_CAPABILITY):
                raise UsageError(
                    "--compute-capability applies to --format tensorrt and --triton-platform tensorrt only"
                )
            return
        engine_step.check_build(req, "--triton-platform tensorrt")
        lib = load_library()
        if lib.name != platform.engine_library or not gpu_available():
            raise UsageError(
                "--triton-platform tensorrt: Triton's tensorrt_plan backend loads engines of TensorRT "
                f"proper built on the GPU it serves on; here only {lib.describe()} "
                f"{'is installed' if gpu_available() else 'without a GPU'} (run this on the GPU machine "
                f"with {install_hint('tensorrt10')}, or use --triton-platform onnxruntime)"
            )

    def out_path(self, req: ExportRequest, stem: str) -> Path:
        """The model's folder ``<repository>/<stem>``, with its version folder ``1/``."""
        repo = req.out or DEFAULT_TRITON_DIR
        if repo.exists() and not repo.is_dir():
            raise UsageError(f"--out {repo} is a file; --format triton writes a model repository folder")
        return writable_dir(writable_dir(repo, "Triton model repository") / stem / "1", "model version folder").parent

    def onnx_path(self, req: ExportRequest, out: Path) -> Path:
        """``1/model.onnx`` for onnxruntime_onnx; beside ``1/`` for tensorrt_plan, whose version folder holds the
        engine."""
        if self._platform(req).builds_engine:
            return out / "model.onnx"
        return self._model_file(req, out)

    @staticmethod
    def _platform(req: ExportRequest) -> TritonPlatform:
        return TRITON_PLATFORMS[req.option(PLATFORM)]

    def _model_file(self, req: ExportRequest, out: Path) -> Path:
        return out / "1" / self._platform(req).model_file

    def steps(self, req: ExportRequest) -> list[Step]:
        engine = []
        if self._platform(req).builds_engine:
            engine = [
                (
                    "tensorrt",
                    lambda req, result: engine_step.build_step(req, result, self._model_file(req, result.path)),
                )
            ]
        return engine + [("triton config", self.write_config)]

    def write_config(self, req: ExportRequest, result) -> None:
        """``config.pbtxt`` and ``labels.txt``, checked with Triton's schema against the graph (config last)."""
        check = write_config(
            result.path,
            ModelContract.from_onnx(result.onnx_path),
            result.onnx_path,
            self._platform(req).platform,
            max(req.batch_sizes),
            req.option(QUEUE_DELAY_US),
        )
        result.parts.append(check)

    def files(self, result) -> list[Path]:
        if result.part(TritonConfigCheck) is None:
            return engine_step.files(result)
        return engine_step.files(result) + [result.path / LABELS_FILE, result.path / "config.pbtxt"]

    def summary(self, result) -> list[str]:
        check = result.part(TritonConfigCheck)
        lines = [triton_summary(result.path, check)] if check is not None else []
        return lines + engine_step.summary(result)

    @contextlib.contextmanager
    def cleanup(self, out: Path) -> Iterator[None]:
        """On failure, remove the model folder made for this export when nothing is in it (Triton refuses a
        repository with a model folder that has no model)."""
        try:
            yield
        except BaseException:
            for folder in (out / "1", out):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only succeeds when empty
            raise


FORMAT = TritonFormat()
