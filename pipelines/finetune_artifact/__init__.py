"""The finetune_artifact pipeline: see pipeline.py."""

from draslice.pipelines.finetune_artifact import pipeline

__all__ = ["pipeline"]
