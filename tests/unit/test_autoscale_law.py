"""The orchestrator's autoscaler's control law (specrl.orchestrator.autoscale), checked
against hand calculations of its model: G' = G R / R', H = G - E hidden, E' = max(0, G' - H),
T' = T - E + E', share' = E' / T'."""

from __future__ import annotations

import pytest

from specrl.config import AutoscaleConfig
from specrl.orchestrator.autoscale import RETRY_AFTER_STEPS, Autoscaler, ExposureControl, Measured

CFG = AutoscaleConfig(
    enabled=True,
    workload="statefulsets/rl-specrl-rollout",
    namespace="train",
    min_replicas=1,
    max_replicas=8,
    target_exposed_share=0.2,
    tolerance=0.05,
    window_steps=2,
    max_factor=2.0,
)


def _decide(law: ExposureControl, m: Measured):
    """A settled window of two identical steps."""
    assert law.observe(m, m.replicas) is None, "one step is not a window"
    return law.observe(m, m.replicas)


def test_the_prediction_matches_the_hand_calculation():
    sync = Measured(replicas=2, step_s=10, gen_s=6, exposed_s=6)  # nothing hidden: share 3/(n+3)
    for n in (1, 2, 3, 4, 8):
        assert sync.predict(n) == pytest.approx(3 / (n + 3))
    hidden = Measured(replicas=4, step_s=5, gen_s=4, exposed_s=1)  # H = 3
    assert hidden.predict(5) == pytest.approx(0.2 / 4.2)  # G' 3.2, E' 0.2, T' 4.2
    assert hidden.predict(2) == pytest.approx(5 / 9)  # G' 8, E' 5, T' 9


def test_too_exposed_scales_up_by_at_most_max_factor_then_holds_at_max():
    law = ExposureControl(CFG)
    d = _decide(law, Measured(2, 10, 6, 6))
    assert d.replicas == 4 and d.measured_share == pytest.approx(0.6)  # 3/(n+3) > 0.2 up to 4
    assert d.predicted_share == pytest.approx(3 / 7)
    # settled at 4: generation got 2.8 s of 3 s predicted faster; still 44% exposed
    d = _decide(law, Measured(4, 7.2, 3.2, 3.2))
    assert d.replicas == 8  # 12.8/(4n + 12.8) needs n >= 12.8: the most allowed, 8
    assert d.predicted_share == pytest.approx(12.8 / 44.8)
    d = _decide(law, Measured(8, 5.6, 1.6, 1.6))
    assert d.replicas == 8 and "at max_replicas" in d.reason


def test_scale_up_takes_the_fewest_replicas_predicted_to_meet_the_target():
    law = ExposureControl(CFG.model_copy(update={"target_exposed_share": 0.1}))
    d = _decide(law, Measured(4, 5, 4, 1))  # 20% > 10% + 5%
    assert d.replicas == 5 and d.predicted_share == pytest.approx(0.2 / 4.2)


def test_well_hidden_scales_down_conservatively_and_within_the_band_holds():
    law = ExposureControl(CFG.model_copy(update={"target_exposed_share": 0.1}))
    d = _decide(law, Measured(8, 5, 2, 0))  # nothing exposed: H >= 2
    # n=6: E' 0.667 -> 11.8%; n=7: E' 0.286 -> 5.4%: the fewest meeting 10% is 7
    assert d.replicas == 7 and d.predicted_share == pytest.approx((16 / 7 - 2) / (5 + 16 / 7 - 2))
    d = _decide(law, Measured(7, 5.3, 2.3, 0.6))  # 11%: within 10% +- 5%
    assert d.replicas == 7 and "within" in d.reason
    assert _decide(law, Measured(1, 5, 1, 0)).replicas == 1  # never under min_replicas


def test_a_scale_up_that_did_not_pay_goes_back_and_sets_a_ceiling():
    law = ExposureControl(CFG)
    assert _decide(law, Measured(2, 10, 6, 6)).replicas == 4
    # at 4 the step exposed 5.5 s: 0.5 s less of 3 s predicted (prompts fewer than slots)
    d = _decide(law, Measured(4, 9.5, 5.5, 5.5))
    assert d.replicas == 2 and "ceiling" in d.reason
    d = _decide(law, Measured(2, 10, 6, 6))
    assert d.replicas == 2 and "at the ceiling" in d.reason
    for _ in range(RETRY_AFTER_STEPS):  # the ceiling expires: scaling up is tried again
        law.observe(Measured(2, 10, 6, 6), asked=3)  # (unsettled steps still count)
    assert _decide(law, Measured(2, 10, 6, 6)).replicas == 4


def test_no_decision_until_every_replica_asked_for_is_in_the_run_for_a_window():
    law = ExposureControl(CFG)
    assert law.observe(Measured(2, 10, 6, 6), asked=4) is None  # two of four joined
    assert law.observe(Measured(4, 10, 6, 6), asked=4) is None  # one settled step
    assert law.observe(Measured(-1, 10, 6, 6), asked=4) is None  # a replica left mid-step
    assert law.observe(Measured(4, 7, 3, 3), asked=4) is None  # the window starts again
    assert law.observe(Measured(4, 7, 3, 3), asked=4) is not None


class _Scale:
    """An in-memory scale subresource (the API-backed one: tests/integration)."""

    def __init__(self, replicas: int, fail: bool = False) -> None:
        self.replicas, self.fail, self.sets = replicas, fail, []

    def get(self) -> int:
        return self.replicas

    def set(self, replicas: int) -> None:
        if self.fail:
            raise RuntimeError("403 Forbidden")
        self.sets.append(replicas)
        self.replicas = replicas


def _record(step: float, gen: float, exposed: float) -> dict:
    return {"time": {"step": step, "gen": gen, "exposed_generation": exposed}}


def test_the_autoscaler_clamps_the_workload_then_follows_the_law():
    scale = _Scale(20)
    auto = Autoscaler(CFG, scale)
    out = auto.on_step(_record(10, 6, 6), 8, True)
    assert scale.sets == [8] and out["asked"] == 8  # 20 is over max_replicas
    assert "reason" not in out  # the window's first step
    out = auto.on_step(_record(10, 6, 6), 8, True)
    assert out["reason"].endswith("at max_replicas (8)") and scale.sets == [8]
    low = _Scale(0)
    Autoscaler(CFG, low).on_step(_record(1, 1, 1), 0, True)
    assert low.sets == [1]  # under min_replicas


def test_steps_not_settled_are_not_measured():
    """A step whose batch was published before the replicas changed is left out, and a
    window is only of consecutive settled steps."""
    scale = _Scale(8)
    auto = Autoscaler(CFG, scale)
    for settled in (True, False, True, False):
        assert "reason" not in auto.on_step(_record(10, 6, 6), 8, settled)
    assert "reason" not in auto.on_step(_record(10, 6, 6), 8, True)
    assert auto.on_step(_record(10, 6, 6), 8, True)["reason"].endswith("at max_replicas (8)")


def test_a_failed_scale_call_is_reported_and_the_run_goes_on():
    auto = Autoscaler(CFG, _Scale(2, fail=True))
    auto.on_step(_record(10, 6, 6), 2, True)
    out = auto.on_step(_record(10, 6, 6), 2, True)
    assert out["error"] == "403 Forbidden" and out["asked"] == 2
