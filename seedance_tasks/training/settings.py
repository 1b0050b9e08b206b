"""Settings of the training pipeline (section `training:` of config/seedance.yaml)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration

MAX_NPROC_PER_NODE = 1024  # far past any node's GPUs: a larger count is a typo that would fork that many trainers
MAX_NNODES = 100_000  # past the largest clusters torchrun's rendezvous has been run on
MAX_RESTARTS = 100  # a failure that recurs 100 times is not transient: more restarts only burn GPU hours


class ModelSettings(StrictModel):
    """The reference trainer's small GPT."""

    vocab_size: int = Field(64, ge=2, description="token vocabulary (synthetic data draws from it)")
    seq_len: int = Field(32, ge=2, description="tokens per sample")
    d_model: int = Field(64, ge=8, description="embedding width")
    n_layers: int = Field(2, ge=1, description="transformer blocks")
    n_heads: int = Field(4, ge=1, description="attention heads (must divide d_model)")


class ScheduleSettings(StrictModel):
    """Effective (global) batch over the run: warmup, hold, decay; realised by gradient accumulation."""

    micro_batch: int = Field(4, ge=1, description="samples per rank per forward pass; never changes")
    start_batch: int = Field(16, ge=1, description="global batch at step 0")
    peak_batch: int = Field(64, ge=1, description="global batch after warmup")
    end_batch: int = Field(32, ge=1, description="global batch at the last step (after decay)")
    warmup_steps: int = Field(10, ge=0, description="steps to ramp start_batch -> peak_batch")
    decay_steps: int = Field(0, ge=0, description="last steps that ramp peak_batch -> end_batch; 0 = none")
    critical_batch: int | None = Field(
        None, ge=1, description="no batch beyond this, and no LR scaling beyond it (null = no cap)"
    )
    base_lr: float = Field(3e-3, gt=0, allow_inf_nan=False, description="learning rate at base_batch")
    base_batch: int = Field(16, ge=1, description="global batch base_lr was tuned at")
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="reference trainer's optimizer")
    lr_scaling: Literal["auto", "sqrt", "linear", "none"] = Field(
        "auto", description="LR vs batch: auto = sqrt for Adam(W), linear for SGD"
    )


class SpotSettings(StrictModel):
    """The EC2 spot interruption notice, polled through IMDSv2 by each node's local rank 0."""

    enabled: bool = Field(True, description="poll for the notice (polling stops by itself where no IMDS answers)")
    endpoint: str = Field("http://169.254.169.254", description="instance metadata service (IMDSv2)")
    poll_interval: Duration = Field(5, gt=0, description="seconds between polls (AWS gives a 2-minute notice)")


class TrainingSettings(StrictModel):
    profile: str = Field("auto", description="NCCL profile name from profiles_file, or auto (from the topology)")
    profiles_file: str | None = Field(None, description="NCCL profiles; null = config/nccl_profiles.yaml")
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="auto = nccl with GPUs, else gloo")
    nic_transport: Literal["auto", "ib", "efa", "none"] = Field(
        "auto", description="how the NICs carry inter-node traffic; auto = from the topology's NIC names "
        "(NICn without a NIC Legend: unknown, NCCL defaults)"
    )
    nproc_per_node: int = Field(0, ge=0, le=MAX_NPROC_PER_NODE,
                                description="processes per node; 0 = one per GPU (2 without GPUs)")
    nnodes: int = Field(1, ge=1, le=MAX_NNODES, description="nodes in the job")
    max_restarts: int = Field(0, ge=0, le=MAX_RESTARTS,
                              description="torchrun restarts of the whole worker group on failure")
    steps: int = Field(100, ge=1, description="optimizer steps of the reference trainer")
    checkpoint_every: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        50, description="save every K steps (0 = only at the end); auto = the Young-Daly optimum "
        "sqrt(2 x save stall x MTBF) from the measured save stall"
    )
    mtbf: Duration = Field(
        86400, gt=0, description="mean time between interruptions/failures for `auto` until the run has history"
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="reference trainer: bf16 autocast (CPU and GPU), or fp16 autocast + GradScaler"
    )
    loss_scale_init: float = Field(65536.0, gt=0, allow_inf_nan=False, description="GradScaler's initial loss scale (fp16)")
    spot: SpotSettings = SpotSettings()
    checkpoint_store: str | None = Field(None, description="checkpoint store; null = checkpoint.store")
    log_dir: str | None = Field(None, description="where launch logs and metrics go; null = a temp folder")
    nccl_debug: Literal["VERSION", "WARN", "INFO"] = Field(
        "INFO", description="NCCL_DEBUG for launched jobs (INFO lets `train health` read channels/transports)"
    )
    collective_timeout: Duration = Field(
        300, gt=0, description="init_process_group timeout: a hung collective fails after this, not PyTorch's "
        "10 min (0 is refused: every collective would time out at once)"
    )
    hang_timeout: Duration = Field(
        900, description="launch kills the job when it prints nothing for this long (0 = never)"
    )
    seed: int = Field(1234, description="seed of the model init and the synthetic data")
    model: ModelSettings = ModelSettings()
    schedule: ScheduleSettings = ScheduleSettings()
