"""Clients of the rollout service: a synchronous one (CLI, tests, the trainer's weight
pushes) and an asyncio one (the orchestrator's generation: one channel per replica, any
number of calls in flight on one event loop)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrl import grpc_options
from specrl.v1 import rollout_pb2 as pb
from specrl.v1 import rollout_pb2_grpc as pb_grpc


def make_prompt(p: str | Sequence[int], history: Sequence[Sequence[int]] = ()) -> pb.Prompt:
    carried = [pb.TokenIds(ids=list(h)) for h in history]
    if isinstance(p, str):
        return pb.Prompt(text=p.encode("utf-8"), history=carried)
    return pb.Prompt(token_ids=pb.TokenIds(ids=list(p)), history=carried)


def make_request(
    prompts: Sequence[str | Sequence[int]],
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    max_tokens: int | None = None,
    n: int = 1,
    seed: int | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    return_text: bool = True,
    history: Sequence[Sequence[Sequence[int]]] = (),
) -> pb.GenerateRequest:
    """`history`: per prompt, earlier responses to it (Prompt.history); () for none."""
    sampling = pb.SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        n=n,
        stop=list(stop),
        stop_token_ids=list(stop_token_ids),
        ignore_eos=ignore_eos,
    )
    if max_tokens is not None:  # None: the server's default
        sampling.max_tokens = max_tokens
    if seed is not None:
        sampling.seed = seed
    return pb.GenerateRequest(
        prompts=[make_prompt(p, h) for p, h in itertools.zip_longest(prompts, history, fillvalue=())],
        sampling=sampling,
        return_text=return_text,
    )


class RolloutClient:
    def __init__(self, address: str, *, timeout: float = 600.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = grpc_options.channel(address)
        self.stub = pb_grpc.RolloutServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def generate(self, prompts: Sequence[str | Sequence[int]], **kwargs) -> pb.GenerateResponse:
        return self.stub.Generate(make_request(prompts, **kwargs), timeout=self.timeout)

    def stream(self, prompts: Sequence[str | Sequence[int]], **kwargs) -> Iterator[pb.Sample]:
        return self.stub.GenerateStream(make_request(prompts, **kwargs), timeout=self.timeout)

    def set_k_schedule(self, schedule: Sequence[tuple[int, int, int]]) -> pb.SpeculationState:
        ranges = [pb.KRange(first=a, last=b, k=k) for a, b, k in schedule]
        return self.stub.SetSpeculation(pb.SetSpeculationRequest(k_schedule=ranges), timeout=60)

    def status(self) -> pb.RolloutStatus:
        return self.stub.GetStatus(pb.GetStatusRequest(), timeout=30)

    def health(self) -> int:
        """The standard gRPC health status of the server (SERVING = 1)."""
        return self._health.Check(health_pb2.HealthCheckRequest(), timeout=10).status

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRolloutClient:
    """The calls generation makes, on a grpc.aio channel: create and use it on one event
    loop. Cancelling a pending `generate` cancels the call (the server aborts it)."""

    def __init__(self, address: str, *, timeout: float | None = 600.0) -> None:
        """`timeout`: each Generate call's deadline (None: none)."""
        self.address = address
        self.timeout = timeout
        self._channel = grpc_options.aio_channel(address)
        self.stub = pb_grpc.RolloutServiceStub(self._channel)

    async def generate(self, prompts: Sequence[str | Sequence[int]], **kwargs) -> pb.GenerateResponse:
        return await self.stub.Generate(make_request(prompts, **kwargs), timeout=self.timeout)

    async def status(self, *, timeout: float = 10.0) -> pb.RolloutStatus:
        return await self.stub.GetStatus(pb.GetStatusRequest(), timeout=timeout)

    async def close(self) -> None:
        await self._channel.close()
