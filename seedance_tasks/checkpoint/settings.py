"""Settings of the checkpoint pipeline (section `checkpoint:` of config/seedance.yaml)."""

from seedance_tasks.config import StrictModel


class CheckpointSettings(StrictModel):
    pass
