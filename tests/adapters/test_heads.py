"""The heads' outputs, losses and predictions, by hand."""

import torch
import torch.nn.functional as F

from gpt_ft.adapters import ChoiceHead, ClassificationHead, RegressionHead


def test_classification_head_adds_the_sequences_then_cross_entropy_and_argmax():
    torch.manual_seed(0)
    head = ClassificationHead(4, 3, dropout=0.0)
    assert head.weight.shape == (3, 4) and not head.bias.any()
    extract = torch.randn(2, 2, 4)  # two sequences per example (similarity's two orders)
    outputs = head(extract)
    torch.testing.assert_close(outputs, (extract[:, 0] + extract[:, 1]) @ head.weight.T + head.bias)
    labels = torch.tensor([2, 0])
    torch.testing.assert_close(
        head.losses(outputs, labels), F.cross_entropy(outputs, labels, reduction="none")
    )
    assert head.predictions(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])).tolist() == [1, 0]


def test_regression_head_squared_error_and_clipped_scores():
    head = RegressionHead(4, score_range=(0.0, 5.0), dropout=0.0)
    outputs = torch.tensor([[-1.0], [2.5], [7.0]])
    labels = torch.tensor([0.0, 3.0, 5.0])
    assert head.losses(outputs, labels).tolist() == [1.0, 0.25, 4.0]
    assert head.predictions(outputs).tolist() == [0.0, 2.5, 5.0]
    assert RegressionHead(4).predictions(outputs).tolist() == [-1.0, 2.5, 7.0]  # no range: unclipped


def test_choice_head_scores_each_choice_and_masks_the_missing_ones():
    torch.manual_seed(0)
    head = ChoiceHead(4, dropout=0.0)
    extract = torch.randn(2, 3, 4)
    scores = head(extract)
    torch.testing.assert_close(scores, (extract @ head.weight.T + head.bias).squeeze(-1))
    mask = torch.tensor([[True, True, True], [True, False, True]])
    masked = head(extract, mask)
    assert masked[1, 1] == torch.finfo(masked.dtype).min
    torch.testing.assert_close(masked[mask], scores[mask])
    assert head.predictions(
        torch.tensor([[0.0, 1.0, 0.5], [2.0, torch.finfo(torch.float).min, 1.0]])
    ).tolist() == [
        1,
        0,
    ]


def test_classifier_dropout_is_one_mask_per_example_as_gpt1s_code():
    """OpenAI's GPT-1 code drops the classifier's input with one mask across a row's choices (its
    noise shape: 1 there): each choice is scored by the same features. Similarity's two orders are
    added first, the dropout the linear layer's input's (the paper's "before the linear layer")."""
    torch.manual_seed(0)
    choice = ChoiceHead(16, dropout=0.5).train()
    same = torch.randn(3, 1, 16).expand(3, 4, 16)  # one state for every choice of each row
    draws = [choice(same) for _ in range(5)]
    for scores in draws:
        torch.testing.assert_close(scores, scores[:, :1].expand(3, 4), rtol=0, atol=0)
    assert len({tuple(d[:, 0].tolist()) for d in draws}) == 5  # (still dropped: another mask each draw)
    torch.testing.assert_close(choice.eval()(same), F.linear(same, choice.weight, choice.bias).squeeze(-1))
    pair = ClassificationHead(16, 3, dropout=0.5).train()
    extract = torch.randn(2, 2, 16)
    torch.manual_seed(1)
    outputs = pair(extract)
    torch.manual_seed(1)
    torch.testing.assert_close(outputs, F.linear(F.dropout(extract.sum(1), 0.5), pair.weight, pair.bias))


def test_heads_keep_the_checkpoint_keys_of_a_linear_layer():
    for head in (ClassificationHead(8, 2), RegressionHead(8), ChoiceHead(8)):
        assert set(head.state_dict()) == {"weight", "bias"}


def test_the_first_best_score_ties_within_a_millionth_and_an_overflowed_one_wins():
    from gpt_ft.adapters.heads import first_best

    assert first_best([0.5, 2.0, 2.0 + 1e-7]) == 1 and first_best([0.5, 2.0, 2.1]) == 2
    assert first_best([float("inf"), 1.0]) == 0 and first_best([1.0, float("inf")]) == 1
    from gpt_ft.adapters.ranking import rank_metric_values  # the metric agrees: the top is the best

    inf = float("inf")
    gold = torch.tensor([[2.0, 1, 0]] * 2, dtype=torch.float64)
    values = rank_metric_values(torch.tensor([[inf, 0, -1], [inf, inf, 0]], dtype=torch.float64), gold)
    assert values["best_of_n"].item() == (1 + 0.5) / 2
