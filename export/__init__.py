"""attnzoo.export: ONNX export with the orthogonal projection kept as explicit ops, verification against
eager PyTorch with ONNX Runtime, the projection checker, and TensorRT engines. CLI: ``export-model``."""

from .onnx_export import (BATCH_DIM, DTYPES, INPUT_NAME, OUTPUT_NAME, SUPPORTED_OPSETS, export_onnx, make_session,
                          metadata_props, op_histogram, read_metadata)

__all__ = ["export_onnx", "make_session", "read_metadata", "metadata_props", "op_histogram", "INPUT_NAME",
           "OUTPUT_NAME", "BATCH_DIM", "SUPPORTED_OPSETS", "DTYPES"]
