"""OpenVINO on the CPU: compile the same verified ONNX file that ONNX Runtime runs, and run it.

The ONNX file is read by OpenVINO's own ONNX front end (``Core.read_model``; no conversion tool, so nothing of
OpenVINO's telemetry is ever called). Settings, for every consumer (benchmark, demo, parity tests):

- ``INFERENCE_PRECISION_HINT f32``: on CPUs with bf16 units (``avx512_bf16``, AMX) OpenVINO would otherwise
  run fp32 graphs in bf16, which is a different precision than the file's, not a faster fp32;
- ``INFERENCE_NUM_THREADS``: the caller's thread count (the benchmark's ``--threads``);
- ``PERFORMANCE_HINT LATENCY``: one stream, all threads on one request (the demo and the benchmark run one
  synchronous request at a time; ``THROUGHPUT`` only pays with several requests in flight);
- ``ENABLE_CPU_PINNING False`` (OpenVINO pins its threads to cores by default): on a machine whose cores are
  busy with other work a pinned thread cannot move off a busy core. A one-off check (not a committed run) on a
  2-core AVX2-only AMD EPYC at load average 8, a micro ViT at batch 1 with one thread: 11.8-13.6 ms pinned,
  1.19-1.33 ms unpinned (ONNX Runtime, which does not pin: 1.29-1.35 ms). ``pin=True`` turns it back on for a
  dedicated machine;
- optionally the batch dimension fixed (``batch``), as the benchmark fixes it for ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np

from .contract import INPUT_NAME, OUTPUT_NAME

__all__ = ["HINTS", "unavailable_reason", "version", "compile_onnx", "OpenVINOSession", "checked_session"]

HINTS = ("LATENCY", "THROUGHPUT")


def unavailable_reason() -> Optional[str]:
    """Why OpenVINO cannot run here (one line), or ``None`` when it can."""
    try:
        import openvino as ov
    except ImportError:
        return "openvino is not installed (pip install openvino)"
    if "CPU" not in ov.Core().available_devices:
        return "OpenVINO has no CPU device on this machine"
    return None


def version() -> Optional[str]:
    """The installed OpenVINO version, or ``None``."""
    try:
        import openvino as ov
    except ImportError:
        return None
    return str(ov.get_version())


def compile_onnx(path: Union[str, Path], *, threads: Optional[int] = None, batch: Optional[int] = None,
                 hint: str = "LATENCY", pin: bool = False):
    """An ``openvino.CompiledModel`` of an ONNX file on the CPU, with the settings of the module docstring.

    Args:
        path: The ``.onnx`` file (an attnzoo export: input ``image``, output ``logits``).
        threads: ``INFERENCE_NUM_THREADS`` (``None``: OpenVINO's default, the machine's cores).
        batch: Fix the batch dimension to this size (``None``: keep it symbolic).
        hint: ``PERFORMANCE_HINT``, one of ``HINTS``.
        pin: ``ENABLE_CPU_PINNING`` (off by default, see the module docstring).

    Raises:
        ValueError: unknown hint, or a batch / thread count below 1.
    """
    import openvino as ov

    if hint not in HINTS:
        raise ValueError(f"unknown performance hint {hint!r}; valid: {', '.join(HINTS)}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    core = ov.Core()
    model = core.read_model(str(path))
    if batch is not None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        shape = model.input(INPUT_NAME).get_partial_shape()
        shape[0] = int(batch)
        model.reshape({INPUT_NAME: shape})
    config: Dict[str, Any] = {"PERFORMANCE_HINT": hint, "INFERENCE_PRECISION_HINT": "f32",
                              "ENABLE_CPU_PINNING": bool(pin)}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return core.compile_model(model, "CPU", config)


class OpenVINOSession:
    """One compiled model and one reused infer request: ``run(x) -> logits`` (float32 NumPy).

    Args:
        path, threads, batch, hint, pin: As for :func:`compile_onnx`.
    """

    def __init__(self, path: Union[str, Path], *, threads: Optional[int] = None, batch: Optional[int] = None,
                 hint: str = "LATENCY", pin: bool = False) -> None:
        self.compiled = compile_onnx(path, threads=threads, batch=batch, hint=hint, pin=pin)
        self.request = self.compiled.create_infer_request()
        self.batch = batch

    def infer(self, x: np.ndarray) -> np.ndarray:
        """One inference; the returned array is the request's own output buffer (overwritten by the next
        call). The input is used in place, without a copy (float32, C-contiguous)."""
        self.request.infer({INPUT_NAME: x}, share_inputs=True, share_outputs=True)
        return self.request.get_tensor(OUTPUT_NAME).data

    def run(self, x: np.ndarray) -> np.ndarray:
        """Logits of ``x`` (N, 3, H, W) as a float32 array the caller owns. A model compiled for batch 1 takes
        any N, one image at a time.

        Raises:
            ValueError: N differs from a fixed batch size other than 1.
        """
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.batch is None or len(x) == self.batch:
            return np.array(self.infer(x), dtype=np.float32)
        if self.batch != 1:
            raise ValueError(f"this OpenVINO model is compiled for batch {self.batch}, got {len(x)} images")
        return np.concatenate([np.array(self.infer(x[i:i + 1]), dtype=np.float32) for i in range(len(x))])

    def info(self) -> Dict[str, Any]:
        """The settings the compiled model ended up with (what a benchmark row reports)."""
        props = {}
        for key in ("INFERENCE_NUM_THREADS", "PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT", "NUM_STREAMS",
                    "ENABLE_CPU_PINNING"):
            try:
                value = self.compiled.get_property(key)
            except Exception:  # noqa: BLE001 -- a property this version does not report is left out
                continue
            # ov.Type -> "f32", enums -> "LATENCY"; ints and bools stay as they are
            props[key.lower()] = value.to_string() if hasattr(value, "to_string") else getattr(value, "name", value)
        return {"openvino": version(), "fixed_batch": self.batch, **props}


def checked_session(path: Union[str, Path], *, threads: Optional[int] = None, batch: Optional[int] = 1,
                    seed: int = 0, contract: Any = None) -> OpenVINOSession:
    """An :class:`OpenVINOSession` whose output on a seeded random batch matches ONNX Runtime's on the same
    file (the runtime export verified against eager) under the shared tolerance table
    (:mod:`attnzoo.runtime.parity`; the key is the graph's precision, from its metadata). ``contract``: the
    file's already-read :class:`~attnzoo.runtime.contract.ModelContract` (read here when ``None``).

    Raises:
        ValueError: the outputs differ beyond the tolerance (naming the file, the error and the tolerance).
    """
    from .contract import ModelContract
    from .parity import compare, tolerance_key
    from .sessions import ort_session

    contract = contract or ModelContract.from_onnx(path)
    session = OpenVINOSession(path, threads=threads, batch=batch)
    x = np.random.default_rng(seed).standard_normal((batch or 2, 3, *contract.input_size), dtype=np.float32)
    ref = ort_session(path, "cpu", threads=threads).run([OUTPUT_NAME], {INPUT_NAME: x})[0]
    check = compare(session.run(x), ref, tolerance_key(contract.dtype))
    if not check["passed"]:
        raise ValueError(f"{Path(path).name}: OpenVINO differs from ONNX Runtime by {check['error']:.3g} "
                         f"(tolerance {check['tolerance']:g}, {check['key']})")
    return session
