"""The finetune pipeline: see pipeline.py."""

from draslice.pipelines.finetune import pipeline

__all__ = ["pipeline"]
