"""Settings of the shards pipeline (section `shards:` of config/seedance.yaml)."""

from seedance_tasks.config import StrictModel


class ShardSettings(StrictModel):
    pass
