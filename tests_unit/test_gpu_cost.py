"""The per-stage GPU cost estimate of docs/gpu-cost.md "What a GPU run costs" (rlhf.flops.stage_costs).

Checks the arithmetic against the module's own formulas written out by hand, so that the
table in docs/gpu-cost.md cannot drift from what the formulas say.
"""

import pytest

from rlhf import flops
from rlhf.config import load_profile

pytestmark = pytest.mark.unit

LENGTHS = flops.Lengths(prompt=51.6, response=19.0)  # measured with Qwen2.5's BPE on r001 (docs/gpu-cost.md)


def test_decode_floor_is_the_actor_weights_over_the_bandwidth():
    p = load_profile("qwen2.5-0.5b")
    shape = flops.Shape.from_profile(p)
    assert flops.decode_step_bytes(shape, 2, 8) == 494_032_768 * 2 + 4_399_104 * 4
    costs = flops.stage_costs(p, LENGTHS, utilisation=0.1)
    assert costs["decode_step_s"] == pytest.approx((494_032_768 * 2 + 4_399_104 * 4) / 4.8e12)


def test_sft_and_ppo_seconds_follow_the_stated_formulas():
    """Catches a stage whose FLOPs or seconds leave out a term (validation, the decode floor)."""
    p = load_profile("qwen2.5-0.5b")
    shape = flops.Shape.from_profile(p)
    u = 0.25
    costs = flops.stage_costs(p, LENGTHS, utilisation=u)
    T = 51.6 + 19.0
    update = 3 * flops.forward_flops(shape, int(8 * T), logit_rows=int(8 * 19.0), lora_rank=8)
    validation = flops.forward_flops(shape, int(180 * T), logit_rows=int(180 * 19.0), lora_rank=8)
    assert costs["sft"]["flops"] == 63 * update + 3 * validation
    assert costs["sft"]["seconds"] == pytest.approx(costs["sft"]["flops"] / (989e12 * u))
    ppo = costs["ppo"]
    assert ppo["decode_steps"] == 100 * 64
    assert ppo["seconds"] == pytest.approx(ppo["flops"] / (989e12 * u) + 6400 * costs["decode_step_s"])
    slower = flops.stage_costs(p, LENGTHS, utilisation=u / 2)
    assert slower["sft"]["seconds"] == pytest.approx(2 * costs["sft"]["seconds"])
