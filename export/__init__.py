"""attnzoo.export: ONNX export with the orthogonal projection kept as explicit ops, verification against
eager PyTorch with ONNX Runtime, the projection checker, and TensorRT engines. CLI: ``export-model``."""

from .check import ProjectionCheckError, assert_projection, check_projection
from .onnx_export import (BATCH_DIM, DTYPES, INPUT_NAME, OUTPUT_NAME, SUPPORTED_OPSETS, export_onnx, make_session,
                          config_from_props, metadata_props, op_histogram, read_metadata)
from .verify import VerificationError, adopt_verified, export_verified, report_path, summary, verify_onnx

__all__ = ["export_onnx", "make_session", "read_metadata", "metadata_props", "config_from_props", "op_histogram", "check_projection",
           "assert_projection", "ProjectionCheckError", "verify_onnx", "export_verified", "adopt_verified", "report_path", "summary",
           "VerificationError", "INPUT_NAME", "OUTPUT_NAME", "BATCH_DIM", "SUPPORTED_OPSETS", "DTYPES"]
