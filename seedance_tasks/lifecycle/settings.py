"""Settings of checkpoint retention and tiering (section `lifecycle:` of config/seedance.yaml)."""

from seedance_tasks.config import StrictModel


class LifecycleSettings(StrictModel):
    pass
