"""``--format triton``: a Triton model repository folder from the verified ONNX (:mod:`.config`):
``<name>/config.pbtxt``, ``labels.txt`` and ``1/model.onnx``, or ``1/model.plan``, an engine built by the TensorRT
target's engine step (``--triton-platform tensorrt``), with the options ``--triton-platform`` and
``--triton-queue-delay-us``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from attnzoo.errors import UsageError, install_hint
from attnzoo.export.formats import ExportFormat, ExportRequest, Step
from attnzoo.fileio import writable_dir
from attnzoo.runtime.contract import ModelContract
from attnzoo.targets.tensorrt import engine_step, gpu_available, load_library
from attnzoo.targets.tensorrt.options import COMPUTE_CAPABILITY

from .config import LABELS_FILE, triton_unavailable_reason, write_config
from .config import summary as triton_summary
from .options import PLATFORM, QUEUE_DELAY_US, TRITON_PLATFORMS, TritonPlatform
from .schema import TritonConfigCheck

__all__ = ["TritonFormat", "FORMAT", "DEFAULT_TRITON_DIR"]

#: ``format="triton"`` without ``out``.
DEFAULT_TRITON_DIR = Path("triton-models")


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
