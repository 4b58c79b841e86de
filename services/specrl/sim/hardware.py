"""Accelerators the simulator knows, per GPU, with the public page each number comes from,
and the efficiency constants that turn peak numbers into achieved ones.

Peak numbers are facts (a table with sources); efficiencies are model constants: the
GPU defaults are stated priors (docs/simulator.md says why each value), the CPU
testbed's are fitted by `specrl.sim.calibrate` to specrl's own measurements."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from specrl.sim.errors import unknown

GB = 1e9
TB = 1e12


class Hardware(BaseModel):
    """One accelerator (per-device numbers) and the node it sits in."""

    model_config = ConfigDict(frozen=True)

    name: str
    peak_flops: float = Field(gt=0, description="dense FLOP/s in the serving dtype (bf16 on GPUs)")
    mem_bw: float = Field(gt=0, description="HBM (or DRAM) bandwidth, bytes/s")
    mem_bytes: float = Field(gt=0, description="HBM (or DRAM) capacity, bytes")
    nvlink_bw: float = Field(gt=0, description="scale-up bandwidth per device, one direction, bytes/s")
    network_bw: float = Field(gt=0, description="scale-out (NIC) bandwidth per device, bytes/s")
    gpus_per_node: int = Field(gt=0, description="devices per Kubernetes node (one pod's GPUs)")
    nvlink_domain: int = Field(gt=0, description="devices one NVLink domain joins (TP/EP stay inside)")
    dtype_bytes: int = Field(2, gt=0, description="bytes per weight / KV element as served")
    source: str


class Efficiency(BaseModel):
    """Achieved fractions of peak and fixed costs: the model's free constants."""

    model_config = ConfigDict(frozen=True)

    mem_eff: float = Field(0.8, gt=0, le=1, description="achieved / peak memory bandwidth in decode")
    compute_eff: float = Field(0.6, gt=0, le=1, description="achieved / peak FLOP/s in decode GEMMs")
    logprob_mfu: float = Field(
        0.4, gt=0, le=1, description="model FLOPs utilization of logprob recomputation"
    )
    train_mfu: float = Field(0.4, gt=0, le=1, description="model FLOPs utilization of the training pass")
    step_overhead_s: float = Field(
        2e-3, ge=0, description="fixed cost of one engine step (scheduler, sampler)"
    )
    draft_overhead_s: float = Field(3e-4, ge=0, description="fixed cost of one sequential draft forward")
    # vLLM runs an external draft model (speculation method draft_model) as a model of its
    # own, with its own inputs and KV cache; on the CPU testbed each of its forwards cost
    # ~5 ms more than the roofline and an EAGLE-3 head's fixed cost say (fitted to the
    # draft-model rows of `bench rollout`; not profiled). No GPU measurement: 0 there.
    draft_model_overhead_s: float = Field(
        0.0, ge=0, description="fixed cost an external draft model's forward adds to draft_overhead_s"
    )
    token_overhead_s: float = Field(0.0, ge=0, description="cost per query token per step (bookkeeping)")
    layer_overhead_s: float = Field(
        0.0, ge=0, description="fixed cost per layer of a forward (op dispatch, launches)"
    )
    emit_overhead_s: float = Field(
        0.0, ge=0, description="cost per emitted token (output processing, logprobs) per step"
    )
    spec_step_overhead_s: float = Field(
        0.0, ge=0, description="fixed cost a speculative step adds (rejection sampler, draft inputs)"
    )
    ngram_lookup_s: float = Field(
        0.0, ge=0, description="host time of n-gram lookup per context token per sequence and step"
    )
    collective_latency_s: float = Field(1e-5, ge=0, description="latency of one TP/EP collective")
    kv_fraction: float = Field(0.9, gt=0, le=1, description="share of device memory the engine may use")
    sync_overhead_s: float = Field(1.0, ge=0, description="fixed cost of a weight sync (handshake, reload)")
    data_s: float = Field(1.0, ge=0, description="data loading and reward per RL step")


# The decode roofline's efficiencies measured on one NVIDIA H200 (`specrl simulate
# fit-forward`, docs/bench/simulator_gpu_fit.json), taken for every GPU.
MEASURED_ROOFLINE = {"mem_eff": 0.5887, "compute_eff": 0.5323}
# Engine costs the paper's rows cannot tell from the per-token cost (fitted with it they
# went to ~1e-7 s and made held-out predictions depend on the optimiser's start): 0 on
# GPUs until vLLM is measured on one (sim/validate.py).
UNIDENTIFIED_COSTS = {"step_overhead_s": 0.0, "spec_step_overhead_s": 0.0, "draft_overhead_s": 0.0}
# The GPU constants (docs/simulator.md, "constants"): the measured roofline and the engine
# costs fitted to the paper's rows (`specrl simulate validate`, sim/validate.py); the
# training MFUs, sync and data costs are stated priors.
PAPER_FIT = {
    "token_overhead_s": 3.709e-05,
    "ngram_lookup_s": 1.493e-07,
}
GPU_EFFICIENCY = Efficiency(**MEASURED_ROOFLINE, **UNIDENTIFIED_COSTS, **PAPER_FIT)

HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware(
            name="h100",
            peak_flops=989e12,
            mem_bw=3.35 * TB,
            mem_bytes=80 * GB,
            nvlink_bw=450 * GB,
            network_bw=50 * GB,
            gpus_per_node=8,
            nvlink_domain=8,
            source="https://www.nvidia.com/en-us/data-center/h100/ (SXM: 989 TFLOPS dense bf16, "
            "3.35 TB/s, 80 GB, NVLink 900 GB/s both directions; ConnectX-7 400 Gb/s per GPU)",
        ),
        Hardware(
            name="h200",
            peak_flops=989e12,
            mem_bw=4.8 * TB,
            mem_bytes=141 * GB,
            nvlink_bw=450 * GB,
            network_bw=50 * GB,
            gpus_per_node=8,
            nvlink_domain=8,
            source="https://www.nvidia.com/en-us/data-center/h200/ (SXM: 989 TFLOPS dense bf16, "
            "4.8 TB/s, 141 GB, NVLink 900 GB/s both directions; 400 Gb/s per GPU)",
        ),
        Hardware(
            name="b200",
            peak_flops=2.25e15,
            mem_bw=8 * TB,
            mem_bytes=180 * GB,
            nvlink_bw=900 * GB,
            network_bw=50 * GB,
            gpus_per_node=8,
            nvlink_domain=8,
            source="https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200: 36 PFLOPS sparse "
            "fp16/bf16 over 8 GPUs = 2.25 PFLOPS dense each, 8 TB/s, 1.4 TB total HBM3e, "
            "NVLink 1.8 TB/s both directions; ConnectX-7 400 Gb/s per GPU)",
        ),
        Hardware(
            name="gb200",
            peak_flops=2.5e15,
            mem_bw=8 * TB,
            mem_bytes=186 * GB,
            nvlink_bw=900 * GB,
            network_bw=50 * GB,
            gpus_per_node=4,
            nvlink_domain=72,
            source="https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (NVL72: 180 PFLOPS "
            "dense fp16/bf16 = 2.5 PFLOPS per GPU, 576 TB/s and 13.4 TB HBM3e over 72 GPUs, "
            "NVLink 1.8 TB/s per GPU both directions; 4 GPUs per compute tray, 400 Gb/s each)",
        ),
        Hardware(
            name="cpu-testbed",
            peak_flops=157e9,
            mem_bw=20 * GB,
            mem_bytes=8 * GB,
            nvlink_bw=1 * GB,
            network_bw=1 * GB,
            gpus_per_node=1,
            nvlink_domain=1,
            dtype_bytes=4,
            source="docs/benchmarks.md: the project's 2-core AMD EPYC (AVX2) machine; peak = 2 cores x "
            "2.45 GHz x 32 fp32 FLOP/cycle; float32 serving; loopback gloo ~1 GB/s (bench weightsync)",
        ),
    )
}


def get_hardware(name: str) -> Hardware:
    """The table's entry for `name` (case-insensitive), or an error listing the known ones."""
    try:
        return HARDWARE[name.lower()]
    except KeyError:
        raise unknown("hardware", name, HARDWARE) from None
