"""attnzoo.export: ``export_model()`` (the library call behind ``export-model``), ONNX export with the variants'
extra math kept as explicit ops, verification against eager PyTorch with ONNX Runtime, the extra-math checker,
int8 / fp8 quantization, TensorRT engines and Triton repositories.

Each name below is imported from its module at its first use (:func:`attnzoo.lazy.lazy_exports`): ``export-model``'s
entry module loads without torch or onnx, so that a bad command line is refused at once.
"""

from typing import TYPE_CHECKING

from attnzoo.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers; at run time each name is imported at its first use
    from .check import ExtraMathCheckError, assert_extra_math, check_extra_math
    from .errors import DiskFullError, ExportError, ExportWarning
    from .formats.base import ExportResult
    from .onnx_export import DTYPES, SUPPORTED_OPSETS, export_onnx, make_session, op_histogram, read_metadata
    from .pipeline import export_model, load_for_export
    from .verify import VerificationError, adopt_verified, export_verified, report_path, summary, verify_onnx

__all__ = [
    "export_model",
    "ExportResult",
    "load_for_export",
    "ExportError",
    "DiskFullError",
    "ExportWarning",
    "export_onnx",
    "make_session",
    "read_metadata",
    "op_histogram",
    "check_extra_math",
    "assert_extra_math",
    "ExtraMathCheckError",
    "verify_onnx",
    "export_verified",
    "adopt_verified",
    "report_path",
    "summary",
    "VerificationError",
    "SUPPORTED_OPSETS",
    "DTYPES",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".check": ("ExtraMathCheckError", "assert_extra_math", "check_extra_math"),
        ".errors": ("DiskFullError", "ExportError", "ExportWarning"),
        ".formats.base": ("ExportResult",),
        ".onnx_export": ("DTYPES", "SUPPORTED_OPSETS", "export_onnx", "make_session", "op_histogram", "read_metadata"),
        ".pipeline": ("export_model", "load_for_export"),
        ".verify": ("VerificationError", "adopt_verified", "export_verified", "report_path", "summary", "verify_onnx"),
    },
)
