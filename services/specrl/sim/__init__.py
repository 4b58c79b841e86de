"""specrl's open performance model of RL post-training with speculative rollouts.

A roofline of each decode step (weights + KV cache read vs FLOPs), a continuous-batching
simulation of one step's generation with a long-tailed response length, the RL step's
other stages (logprob, train, weight sync, data) in sync and async (policy lag) mode,
calibration against specrl's own measured benchmarks, the paper's published points for
validation, and a planner that searches the generation/training split, k and lag.
docs/simulator.md describes the equations and their limits."""

from specrl.sim.errors import SimError

__all__ = ["SimError"]
