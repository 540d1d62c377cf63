"""The finetune-trainjob pipeline: see pipeline.py."""

from draslice.pipelines.finetune_trainjob import pipeline

__all__ = ["pipeline"]
