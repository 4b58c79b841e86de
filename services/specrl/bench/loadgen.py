"""Load generators for the orchestrator: lightweight endpoints of the real RolloutService
gRPC API that answer Generate after a long-tailed latency with made-up tokens. They
measure how the orchestrator's generation scales with replicas and slots (its threads,
its Redis connections, groups per second) where a fleet of real engines cannot run; they
replace vLLM in no other test or benchmark.

The endpoints run in a child process (`LoadEndpoints`), so that what is measured in the
orchestrator's process is the orchestrator's own: one grpc.aio server bound to many ports,
each port one "replica".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys

import grpc

from specrl.v1 import rollout_pb2 as pb
from specrl.v1 import rollout_pb2_grpc as pb_grpc


class _Endpoint(pb_grpc.RolloutServiceServicer):
    """Generate: n samples of `tokens` tokens at policy version 0, after a lognormal
    latency (median `median_s`, shape `sigma`: a long tail, as RL generations have)."""

    def __init__(self, median_s: float, sigma: float, tokens: int, seed: int) -> None:
        self.median_s, self.sigma, self.tokens = median_s, sigma, tokens
        self.rng = random.Random(seed)

    async def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:
        seconds = self.median_s * math.exp(self.sigma * self.rng.gauss(0.0, 1.0))
        await asyncio.sleep(seconds)
        n = max(1, request.sampling.n)
        samples = [
            pb.Sample(
                prompt_index=p,
                sample_index=j,
                token_ids=list(range(1, self.tokens + 1)),
                logprobs=[-0.5] * self.tokens,
                text="",
                finish_reason=pb.FINISH_REASON_LENGTH,
            )
            for p in range(len(request.prompts))
            for j in range(n)
        ]
        return pb.GenerateResponse(samples=samples, seconds=seconds)


async def _serve(endpoints: int, median_s: float, sigma: float, tokens: int, seed: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_RolloutServiceServicer_to_server(_Endpoint(median_s, sigma, tokens, seed), server)
    ports = [server.add_insecure_port("127.0.0.1:0") for _ in range(endpoints)]
    await server.start()
    print(json.dumps([f"127.0.0.1:{p}" for p in ports]), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
    await server.stop(grace=None)


class LoadEndpoints:
    """`endpoints` load-generator replicas in a child process; `addresses` once entered."""

    def __init__(self, endpoints: int, *, median_s: float = 0.2, sigma: float = 0.8, tokens: int = 8) -> None:
        self.args = [f"--endpoints={endpoints}", f"--median-s={median_s}", f"--sigma={sigma}"]
        self.args.append(f"--tokens={tokens}")
        self.proc: subprocess.Popen | None = None
        self.addresses: list[str] = []

    def __enter__(self) -> LoadEndpoints:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specrl.bench.loadgen", *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"load endpoints exited with {self.proc.wait()} before serving")
        self.addresses = json.loads(line)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, required=True)
    parser.add_argument("--median-s", type=float, default=0.2)
    parser.add_argument("--sigma", type=float, default=0.8)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    asyncio.run(_serve(a.endpoints, a.median_s, a.sigma, a.tokens, a.seed))


if __name__ == "__main__":
    main()
