"""Settings of the training pipeline (section `training:` of config/seedance.yaml)."""

from seedance_tasks.config import StrictModel


class TrainingSettings(StrictModel):
    pass
