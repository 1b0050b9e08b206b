"""Settings of the preprocess pipeline (section `preprocess:` of config/seedance.yaml)."""

from seedance_tasks.config import StrictModel


class PreprocessSettings(StrictModel):
    pass
