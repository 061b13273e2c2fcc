"""The failures of an export step (verification, quantization, engine build): each says in one line what failed
and where its failed report is; nothing was written at the output path."""

from __future__ import annotations

__all__ = ["ExportError", "DiskFullError", "ExportWarning"]


class ExportError(RuntimeError):
    """An export step failed its checks; the message names the failure and the failed report."""


class DiskFullError(ExportError):
    """A write of the export found no room (:func:`attnzoo.fileio.no_space_problem`): the disk, not the model, is at
    fault, so no failed report blames the model; nothing was written at the output path."""


class ExportWarning(UserWarning):
    """Something the user should know about an export that still goes ahead (an untrained model, random
    calibration, few held-out inputs)."""
