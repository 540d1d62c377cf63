"""The finetune pipelines (model from the volume or a Model artifact, run as a task or as a
TrainJob): see pipeline.py."""

from draslice.pipelines.finetune import pipeline

__all__ = ["pipeline"]
