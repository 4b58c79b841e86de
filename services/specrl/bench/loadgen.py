"""Load generators for the orchestrator: lightweight endpoints of the real RolloutService
gRPC API that answer Generate after a long-tailed latency with made-up tokens. They
measure how the orchestrator's generation scales with replicas and slots (its threads,
its Redis connections, groups per second) where a fleet of real engines cannot run; they
replace vLLM in no other test or benchmark.

The endpoints run in a child process (`LoadEndpoints`), so that what is measured in the
orchestrator's process is the orchestrator's own: one grpc.aio server bound to many ports,
each port one "replica"; optionally one endpoint of the TrainerService API too, whose
TrainStep takes a fixed time and whose PushWeights "updates" the replicas of the same
process (their samples carry the version it pushed).

Each endpoint reports a capacity in GetStatus (`max_num_seqs`, as a rollout server
reports its engine's), from which the orchestrator derives its slots unless
orchestrator.concurrency is set; once the endpoints stop, `LoadEndpoints` holds the most
Generate calls they had in flight at once (`peak_in_flight`) and how many they answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

import grpc

from specrl.v1 import rollout_pb2 as pb
from specrl.v1 import rollout_pb2_grpc as pb_grpc
from specrl.v1 import trainer_pb2 as tpb
from specrl.v1 import trainer_pb2_grpc as tpb_grpc


class _Policy:
    version = 0  # the version the trainer endpoint pushed last: every sample's


class _Endpoint(pb_grpc.RolloutServiceServicer):
    """Generate: n samples of `tokens` tokens at policy version 0, after a lognormal
    latency (median `median_s`, shape `sigma`: a long tail, as RL generations have);
    GetStatus: tokens_generated advancing with time, as an engine at work, and
    `max_num_seqs` as its capacity. `hang`: an engine that stopped, Generate never answers
    and tokens_generated stands still. Counts the calls in flight (GetStatus's
    requests_in_flight), their peak and the calls answered, over every port it serves.
    Its instance is new each start (as a rollout server's); a sample's text says how many
    earlier responses were carried with its prompt (Prompt.history)."""

    def __init__(
        self,
        median_s: float,
        sigma: float,
        tokens: int,
        seed: int,
        hang: bool,
        policy: _Policy,
        max_num_seqs: int = 64,
        method: str = "",
    ) -> None:
        self.method = method  # the speculation method GetStatus reports
        self.median_s, self.sigma, self.tokens, self.hang = median_s, sigma, tokens, hang
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.rng = random.Random(seed)
        self.started = time.monotonic()
        self.in_flight = self.peak_in_flight = self.calls = 0
        self.instance = uuid.uuid4().hex[:16]  # a new one each start, as a rollout server's

    async def GetStatus(self, request: pb.GetStatusRequest, context) -> pb.RolloutStatus:
        generated = 0 if self.hang else int((time.monotonic() - self.started) * 1000)
        return pb.RolloutStatus(
            engine="loadgen",
            tokens_generated=generated,
            max_num_seqs=self.max_num_seqs,
            speculation_method=self.method,
            speculation=pb.SpeculationState(history=self.method == "history"),
            requests_in_flight=self.in_flight,
            instance=self.instance,
        )

    async def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._generate(request)
        finally:
            self.in_flight -= 1

    async def _generate(self, request: pb.GenerateRequest) -> pb.GenerateResponse:
        if self.hang:
            await asyncio.Event().wait()
        version = self.policy.version  # as a rollout server stamps it: at admission
        seconds = self.median_s * math.exp(self.sigma * self.rng.gauss(0.0, 1.0))
        await asyncio.sleep(seconds)
        self.calls += 1
        n = max(1, request.sampling.n)
        samples = [
            pb.Sample(
                prompt_index=p,
                sample_index=j,
                token_ids=list(range(1, self.tokens + 1)),
                logprobs=[-0.5] * self.tokens,
                text=f"history={len(request.prompts[p].history)}",  # responses carried to it
                finish_reason=pb.FINISH_REASON_LENGTH,
                policy_version=version,
            )
            for p in range(len(request.prompts))
            for j in range(n)
        ]
        return pb.GenerateResponse(samples=samples, seconds=seconds)


class _Trainer(tpb_grpc.TrainerServiceServicer):
    """TrainStep: `step_s` seconds, then the next version; PushWeights: every replica
    named is updated at once; SaveCheckpoint: nothing saved (the path returned)."""

    def __init__(self, step_s: float, policy: _Policy) -> None:
        self.step_s, self.policy = step_s, policy

    async def GetStatus(self, request, context) -> tpb.TrainerStatus:
        return tpb.TrainerStatus(model="loadgen", tp=1, dp=1, step=self.policy.version)

    async def TrainStep(self, request: tpb.TrainStepRequest, context) -> tpb.TrainStepResponse:
        await asyncio.sleep(self.step_s)
        self.policy.version += 1
        stats = dict.fromkeys(("loss", "kl", "entropy", "grad_norm", "clip_fraction"), 0.0)
        metrics = tpb.StepMetrics(stats=stats, train_seconds=self.step_s, tokens=len(request.inline.samples))
        return tpb.TrainStepResponse(metrics=metrics, step=self.policy.version)

    async def PushWeights(self, request: tpb.PushWeightsRequest, context) -> tpb.PushWeightsResponse:
        return tpb.PushWeightsResponse(version=self.policy.version, updated=list(request.replicas))

    async def SaveCheckpoint(self, request, context) -> tpb.SaveCheckpointResponse:
        return tpb.SaveCheckpointResponse(path=request.path, step=self.policy.version)


async def _serve(
    endpoints: int,
    median_s: float,
    sigma: float,
    tokens: int,
    seed: int,
    hang: bool,
    trainer_step_s: float | None,
    max_num_seqs: int = 64,
    ports: Sequence[int] = (),
    hosts: bool = False,
    method: str = "",
) -> None:
    policy = _Policy()
    server = grpc.aio.server()
    endpoint = _Endpoint(median_s, sigma, tokens, seed, hang, policy, max_num_seqs, method)
    pb_grpc.add_RolloutServiceServicer_to_server(endpoint, server)
    if hosts:  # one port, an address each (127.0.0.1, 127.0.0.2, ...): pods behind a Service
        port = server.add_insecure_port("127.0.0.1:0")
        addresses = [f"127.0.0.{i + 1}:{port}" for i in range(endpoints)]
        bound = [port] + [server.add_insecure_port(a) for a in addresses[1:]]
    else:
        bound = [server.add_insecure_port(f"127.0.0.1:{p}") for p in (ports or [0] * endpoints)]
        addresses = [f"127.0.0.1:{p}" for p in bound]
    if 0 in bound:
        raise SystemExit(f"could not bind every one of {addresses}")
    trainer = None
    if trainer_step_s is not None:
        trainer = grpc.aio.server()
        tpb_grpc.add_TrainerServiceServicer_to_server(_Trainer(trainer_step_s, policy), trainer)
        trainer_port = trainer.add_insecure_port("127.0.0.1:0")
        await trainer.start()
    await server.start()
    print(json.dumps({
        "rollout": addresses,
        "trainer": f"127.0.0.1:{trainer_port}" if trainer else "",
    }), flush=True)  # fmt: skip
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
    await server.stop(grace=None)
    if trainer is not None:
        await trainer.stop(grace=None)
    print(json.dumps({"peak_in_flight": endpoint.peak_in_flight, "calls": endpoint.calls}), flush=True)


class LoadEndpoints:
    """`endpoints` load-generator replicas in a child process; `addresses` once entered."""

    def __init__(
        self,
        endpoints: int,
        *,
        median_s: float = 0.2,
        sigma: float = 0.8,
        tokens: int = 8,
        hang: bool = False,
        trainer_step_s: float | None = None,
        max_num_seqs: int = 64,
        ports: Sequence[int] = (),
        hosts: bool = False,
        method: str = "",
    ) -> None:
        """`trainer_step_s`: also serve a trainer endpoint (`trainer`) whose step takes
        that long. `max_num_seqs`: the capacity every endpoint reports in GetStatus.
        `ports`: the endpoints' ports (one each; default: free ones). `hosts`: every
        endpoint on one port at its own loopback address, as pods behind one Service.
        `method`: the speculation method GetStatus reports (none by default)."""
        if ports and len(ports) != endpoints:
            raise ValueError(f"{len(ports)} ports for {endpoints} endpoints")
        self.args = [f"--endpoints={endpoints}", f"--median-s={median_s}", f"--sigma={sigma}"]
        self.args += [f"--tokens={tokens}", f"--max-num-seqs={max_num_seqs}"] + (["--hang"] if hang else [])
        if trainer_step_s is not None:
            self.args.append(f"--trainer-step-s={trainer_step_s}")
        if ports:
            self.args.append(f"--ports={','.join(map(str, ports))}")
        if hosts:
            self.args.append("--hosts")
        if method:
            self.args.append(f"--method={method}")
        self.proc: subprocess.Popen | None = None
        self.addresses: list[str] = []
        self.trainer = ""
        # once exited: the most Generate calls in flight at once over all the endpoints
        # (one endpoint: on that replica), and the calls they answered
        self.peak_in_flight = self.calls = 0

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
        served = json.loads(line)
        self.addresses, self.trainer = served["rollout"], served["trainer"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return
            assert self.proc.stdout is not None
            lines = self.proc.stdout.read().splitlines()
            if lines:
                counts = json.loads(lines[-1])
                self.peak_in_flight, self.calls = counts["peak_in_flight"], counts["calls"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, required=True)
    parser.add_argument("--median-s", type=float, default=0.2)
    parser.add_argument("--sigma", type=float, default=0.8)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang", action="store_true", help="endpoints whose engine stopped")
    parser.add_argument("--trainer-step-s", type=float, default=None, help="also a trainer endpoint")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the capacity GetStatus reports")
    parser.add_argument(
        "--ports", default="", help="comma-separated ports, one per endpoint (default: free ones)"
    )
    parser.add_argument("--hosts", action="store_true", help="one port, a loopback address each")
    parser.add_argument("--method", default="", help="the speculation method GetStatus reports")
    a = parser.parse_args()
    ports = [int(p) for p in a.ports.split(",") if p]
    asyncio.run(
        _serve(
            a.endpoints,
            a.median_s,
            a.sigma,
            a.tokens,
            a.seed,
            a.hang,
            a.trainer_step_s,
            a.max_num_seqs,
            ports,
            a.hosts,
            a.method,
        )
    )


if __name__ == "__main__":
    main()
