"""Settings of the cost pipeline (section `cost:` of config/seedance.yaml)."""

from seedance_tasks.config import StrictModel


class CostSettings(StrictModel):
    pass
