import pytest
import torch

from advpt.data.collate import MaskingCollator
from advpt.masking import (
    adversarial_corrupt,
    gumbel_like,
    hard_top_k,
    num_scores,
    random_mask,
    relaxed_subset_sample,
    span_mask,
    subset_sizes,
)
from advpt.tokenizer import TAPE


def ragged_eligible(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def test_subset_sampler_picks_exactly_k_eligible_positions():
    torch.manual_seed(0)
    eligible = ragged_eligible([40, 25, 3, 0], 40)
    eligible[1, 5] = False  # a hole inside a row
    k = subset_sizes(eligible, 0.2)
    assert k.tolist() == [8, 5, 1, 0]
    scores = torch.randn(4, 40)
    soft = relaxed_subset_sample(scores, eligible, k, temperature=0.5)
    hard = hard_top_k(soft, eligible, k)
    assert hard.sum(1).tolist() == k.tolist()
    assert not (hard & ~eligible).any()
    # the relaxation puts (almost) all mass on eligible positions and sums to k
    assert soft[~eligible].abs().max() < 1e-6
    torch.testing.assert_close(soft.sum(1), k.float(), atol=1e-3, rtol=0)


def test_subset_sampler_gradients_are_finite_and_nonzero():
    torch.manual_seed(1)
    eligible = ragged_eligible([30, 17], 30)
    k = subset_sizes(eligible, 0.3)
    scores = torch.randn(2, 30, requires_grad=True)
    soft = relaxed_subset_sample(scores, eligible, k, temperature=1.0)
    (soft * torch.randn(2, 30)).sum().backward()
    grad = scores.grad
    assert torch.isfinite(grad).all()
    assert grad[eligible].abs().sum() > 0


def test_subset_sampler_tends_to_hard_top_k_as_temperature_falls():
    torch.manual_seed(2)
    eligible = ragged_eligible([50, 50, 35], 50)
    k = subset_sizes(eligible, 0.2)
    scores = torch.randn(3, 50) * 3
    gumbel = gumbel_like(scores)
    perturbed = scores + gumbel
    target = hard_top_k(perturbed, eligible, k).float()
    errors = []
    for t in (3.0, 1.0, 0.1, 0.003):
        soft = relaxed_subset_sample(scores, eligible, k, temperature=t, gumbel=gumbel)
        errors.append((soft - target).abs().sum().item())
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < 0.05 * k.sum().item()


def test_subset_sampler_keeps_fp32_exclusion_for_half_scores():
    eligible = ragged_eligible([10], 20)
    k = torch.tensor([5])
    scores = torch.zeros(1, 20, dtype=torch.bfloat16)
    scores[0, 10:] = 20  # ineligible positions with large scores must still get nothing
    soft = relaxed_subset_sample(scores, eligible, k)
    assert soft.dtype == torch.float32
    assert soft[0, 10:].max() < 1e-6


def test_random_mask_rates_and_split_over_many_draws():
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(TAPE.first_residue_id, TAPE.size, (200, 500), generator=generator)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, :2] = False
    inputs, masked = random_mask(ids, maskable, 0.15, TAPE, generator)
    assert not masked[:, :2].any()
    rate = masked[:, 2:].float().mean().item()
    assert rate == pytest.approx(0.15, abs=0.005)
    changed = inputs[masked]
    original = ids[masked]
    mask_share = (changed == TAPE.mask_id).float().mean().item()
    same_share = (changed == original).float().mean().item()
    assert mask_share == pytest.approx(0.8, abs=0.01)
    # keep (10%) plus replacements that happen to draw the original residue (10% / 25)
    assert same_share == pytest.approx(0.1 + 0.1 / 25, abs=0.01)
    assert (changed >= TAPE.first_residue_id).logical_or(changed == TAPE.mask_id).all()
    assert torch.equal(inputs[~masked], ids[~masked])


def test_span_mask_takes_exact_budgets_in_geometric_spans():
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(TAPE.first_residue_id, TAPE.size, (300, 200), generator=generator)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, 0] = False  # <cls>
    maskable[:, 150:] = torch.arange(300)[:, None] % 2 == 0  # every other row is shorter
    maskable[1::2, 149] = False  # a <sep> inside the row
    inputs, masked = span_mask(ids, maskable, 0.4, TAPE, generator, mean_span=3.0)
    assert torch.equal(masked.sum(1), subset_sizes(maskable, 0.4))  # the budget, exactly
    assert not (masked & ~maskable).any()
    # maximal runs of masked positions: spans of mean 3 (clipped at 10), some of them merged
    runs = [len(r) for row in masked.int().tolist() for r in "".join(map(str, row)).split("0") if r]
    assert 3.0 < sum(runs) / len(runs) < 6.0
    assert sum(1 for r in runs if r == 1) > 0.1 * len(runs)  # not all one length
    changed, original = inputs[masked], ids[masked]
    assert (changed == TAPE.mask_id).float().mean().item() == pytest.approx(0.8, abs=0.01)
    assert (changed == original).float().mean().item() == pytest.approx(0.104, abs=0.01)
    assert torch.equal(inputs[~masked], ids[~masked])
    # a generator in the same state draws the same spans (the stream is a function of its seed)
    generator.manual_seed(5)
    first = span_mask(ids, maskable, 0.4, TAPE, generator)
    generator.manual_seed(5)
    assert all(map(torch.equal, first, span_mask(ids, maskable, 0.4, TAPE, generator)))


def test_collator_masks_spans_with_the_random_share():
    examples = [[2, *range(5, 29), *range(5, 29), 3], [2, *range(5, 25), 3]]
    batch = MaskingCollator(0.2, 0.1, 0, TAPE, mean_span=4.0)(examples, batch_number=0)
    residues = TAPE.is_residue(batch.ids).sum(1)
    assert torch.equal(batch.random_masked.sum(1), torch.round(residues * 0.2).long())
    assert torch.equal(batch.budget, torch.round(residues * 0.1).long())
    assert not (batch.eligible & batch.random_masked).any()


def _batch(seed: int = 0):
    torch.manual_seed(seed)
    examples = [torch.randint(TAPE.first_residue_id, TAPE.size, (n,)).numpy() for n in (60, 41, 23)]
    examples = [[2, *e.tolist(), 3] for e in examples]
    return MaskingCollator(0.1, 0.1, seed, TAPE)(examples, batch_number=0)


def test_collator_budget_adds_up_to_the_paper_total():
    batch = _batch()
    residues = TAPE.is_residue(batch.ids).sum(1)
    assert torch.equal(batch.budget, torch.round(residues * 0.1).long())
    assert not (batch.eligible & batch.random_masked).any()
    assert batch.num_masked == int(batch.random_masked.sum() + batch.budget.sum())
    assert batch.lengths.tolist() == [62, 43, 25]


@pytest.mark.parametrize("literal", [False, True])
def test_straight_through_forward_is_hard_and_backward_is_soft(literal: bool):
    batch = _batch(1)
    scores = torch.randn(*batch.ids.shape, num_scores(TAPE), requires_grad=True)
    sample = adversarial_corrupt(
        scores, batch.inputs, batch.eligible, batch.budget, batch.max_budget, TAPE,
        straight_through_positions=not literal,
    )  # fmt: skip
    # forward: exactly one-hot, equal to the inputs outside the chosen positions
    assert torch.equal(sample.one_hot.sum(-1), torch.ones(batch.ids.shape))
    assert set(sample.one_hot.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(sample.ids[~sample.positions], batch.inputs[~sample.positions])
    assert sample.positions.sum(1).tolist() == batch.budget.tolist()
    assert not (sample.positions & ~batch.eligible).any()
    # backward: gradients reach option scores; position scores only with straight-through
    (sample.one_hot * torch.randn(TAPE.size)).sum().backward()
    assert scores.grad[..., 1:].abs().sum() > 0
    any_grad = scores.grad[..., 0].abs().sum()
    assert (any_grad == 0) if literal else (any_grad > 0)


def test_straight_through_gradient_equals_soft_probability_gradient():
    batch = _batch(2)
    torch.manual_seed(5)
    scores = torch.randn(*batch.ids.shape, num_scores(TAPE), requires_grad=True)
    direction = torch.randn(TAPE.size)
    torch.manual_seed(6)
    sample = adversarial_corrupt(
        scores, batch.inputs, batch.eligible, batch.budget, batch.max_budget, TAPE
    )
    (sample.one_hot * direction).sum().backward()
    st_grad = scores.grad.clone()

    # Same draws, written out as the soft expression whose gradient straight-through must give.
    scores.grad = None
    torch.manual_seed(6)
    s = scores.float()
    p_any = relaxed_subset_sample(s[..., 0], batch.eligible, batch.budget, max_k=batch.max_budget)
    p_opt = torch.softmax(s[..., 1:] + gumbel_like(s[..., 1:]), dim=-1)
    x = torch.nn.functional.one_hot(batch.inputs, TAPE.size).float()
    mask_token = torch.nn.functional.one_hot(torch.tensor(TAPE.mask_id), TAPE.size).float()
    replace = torch.nn.functional.pad(p_opt[..., 2:], (TAPE.first_residue_id, 0))
    x_masked = p_opt[..., :1] * mask_token + p_opt[..., 1:2] * x + replace
    # Straight-through differentiates x~ = (1 - A) x + A x_m(M) as if A = p_any and M = p_opt
    # while evaluating everything else at the hard sample: this surrogate has that gradient.
    hard_any = sample.positions.float()
    hard_opt = torch.nn.functional.one_hot(sample.option, p_opt.shape[-1]).float()
    x_masked_hard = (
        hard_opt[..., :1] * mask_token + hard_opt[..., 1:2] * x
        + torch.nn.functional.pad(hard_opt[..., 2:], (TAPE.first_residue_id, 0))
    )  # fmt: skip
    surrogate = (
        ((x_masked_hard - x) * direction).sum(-1) * p_any
        + hard_any * ((x_masked - x_masked.detach()) * direction).sum(-1)
    ).sum()
    surrogate.backward()
    torch.testing.assert_close(st_grad, scores.grad, rtol=1e-5, atol=1e-6)
