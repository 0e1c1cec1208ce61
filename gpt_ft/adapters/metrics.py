"""Benchmark metrics of single-label tasks (GLUE's conventions), from torchmetrics but for Matthews'
correlation, and the card's choice of them; retrieval metrics of ranked candidates; process
rewards' step metrics (`Steps`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gpt_ft.adapters.contrastive import first_copies
from gpt_ft.adapters.heads import TIE, tied
from gpt_ft.errors import CardError

METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")


def metric_value(name: str, predictions: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """One benchmark metric; F1 and MCC are binary (positive class 1) for two classes, as GLUE reports."""
    from torchmetrics.functional import accuracy, f1_score, pearson_corrcoef  # (not for every command)

    binary = num_classes == 2
    if name == "accuracy":
        return accuracy(predictions, labels, task="multiclass", num_classes=num_classes, average="micro")
    if name == "f1":
        if binary:
            return f1_score(predictions, labels, task="binary")
        return f1_score(predictions, labels, task="multiclass", num_classes=num_classes, average="macro")
    if name == "matthews":
        return matthews(predictions, labels, num_classes)
    if name in ("pearson", "spearman"):
        x, y = predictions.double(), labels.double()
        # Undefined where either side is constant, holds a NaN or is one value (torchmetrics ranks
        # NaNs as numbers, and gives Spearman 0 for such sides): NaN, as scipy has it. Values within
        # `TIE` are one (a model's equal predictions, computed in other batches, differ in last bits).
        if not (len(x) > 1 and spread(x) and spread(y)):
            return x.new_tensor(math.nan)
        return pearson_corrcoef(x, y) if name == "pearson" else pearson_corrcoef(ranks(x), ranks(y))
    raise ValueError(f"Unknown metric {name!r}; allowed: {', '.join(METRICS)}.")


def spread(values: Tensor) -> bool:
    """Whether `values` hold two that do not tie (`TIE`, relative to the largest, absolutely below 1)."""
    span = values.max() - values.min()
    return bool(span > TIE * max(1.0, float(values.abs().max())))


def ranks(values: Tensor) -> Tensor:
    """1-based ranks, tied values sharing their mean rank (scipy's `rankdata`): Spearman's is the
    Pearson correlation of these. Values `tied` with the smallest of their run tie (a row and its
    copy, scored in other batches or places of a packed row, differ in last bits, and were ranked
    apart); a run ends where a value is not, so that values more than `TIE` apart never tie through
    others between them. torchmetrics' `spearman_corrcoef` adds 1e-6 to its denominator, which gave
    a perfect ranking 0.9999985 on three examples."""
    ordered, order = values.detach().double().cpu().sort()
    starts = torch.ones_like(ordered, dtype=torch.bool)  # where a run of values each tied to the last starts
    starts[1:] = ~tied(ordered[1:], ordered[:-1])
    run = cut_runs(ordered, starts).cumsum(0) - 1
    counts = torch.bincount(run).double()
    ranked = torch.empty_like(ordered)
    ranked[order] = (counts.cumsum(0) - (counts - 1) / 2)[run]
    return ranked.to(values.device)


def cut_runs(ordered: Tensor, starts: Tensor) -> Tensor:
    """`starts`, where runs of values each `tied` to the one before begin in the ascending host
    tensor `ordered`, with each run that spans more than `TIE` cut where its first value's ties end,
    then again: values more than `TIE` apart never tie through others between them."""
    bounds = starts.nonzero().flatten()
    ends = torch.cat([bounds[1:], bounds.new_tensor([len(ordered)])])
    firsts, lasts = ordered[bounds], ordered[ends - 1]
    for k in (lasts - firsts > TIE * firsts.abs().clamp(min=1.0)).nonzero().flatten().tolist():
        start, end = int(bounds[k]), int(ends[k])
        while float(ordered[end - 1]) - float(ordered[start]) > TIE * max(1.0, abs(float(ordered[start]))):
            first = float(ordered[start])
            start += int(
                torch.searchsorted(ordered[start:end], first + TIE * max(1.0, abs(first)), right=True)
            )
            starts[start] = True
    return starts


def matthews(predictions: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """Matthews' correlation, Gorodkin's K-class form (the binary one at K = 2): 0 where the labels
    or the predictions are all one class, as GLUE's scorer (scikit-learn) has it; torchmetrics
    gives such a split 1 when every prediction is right, and values between on the others."""
    confusion = torch.bincount(labels.long() * num_classes + predictions.long(), minlength=num_classes**2)
    confusion = confusion.view(num_classes, num_classes).double()
    true, predicted, total = confusion.sum(dim=1), confusion.sum(dim=0), confusion.sum()
    covariance = confusion.trace() * total - (true * predicted).sum()
    spread = (total**2 - (predicted**2).sum()) * (total**2 - (true**2).sum())
    return torch.where(spread > 0, covariance / spread.clamp(min=1).sqrt(), 0.0).float()


@dataclass
class Scoring:
    """A card's metrics, and the one that picks the best checkpoint."""

    metrics: list[str]
    main_metric: str

    @classmethod
    def from_card(
        cls,
        task_name: str,
        metrics: list[str] | None,
        main_metric: str | None,
        *,
        allowed: tuple[str, ...],
        default: tuple[str, ...],
        kind: str | None = None,
    ) -> Scoring:
        """The card's `metrics` (default: `default`), each among `allowed` (those of the output
        `kind`: a correlation does not score classes), and its `main_metric` (default: the first)
        among them."""
        metrics = list(metrics) if metrics else list(default)
        unknown = [m for m in metrics if m not in allowed]
        if unknown:
            of_kind = f" (the metrics of {'an' if kind[0] in 'aeiou' else 'a'} {kind} task)" if kind else ""
            raise CardError(
                f"Task {task_name!r}: unknown metric(s) {unknown}; allowed: {', '.join(allowed)}{of_kind}."
            )
        main_metric = main_metric or metrics[0]
        if main_metric not in metrics:
            raise CardError(
                f"Task {task_name!r}: main_metric {main_metric!r} is not among metrics {metrics}."
            )
        return cls(metrics, main_metric)


RETRIEVAL = ("mrr@10", "ndcg@10", "recall@1", "recall@10")


def retrieval_metrics(
    queries: Tensor, corpus: Tensor, texts: Tensor, metrics: list[str]
) -> dict[str, Tensor]:
    """Each distinct query text (at its first row) against the distinct documents of `corpus`, its
    relevant ones the positives of every row with that query text (`ranked_metrics`). `texts`
    (Q, 2, K) says which text each query and each row of `corpus` is (`text_key`): rows of one text
    are one document (a positive several rows share, a query with several positives), as MTEB's
    and sentence-transformers' corpora of ids have it. Texts are told apart by their keys, not
    their vectors: a model that gives every text one vector ties them all, and scores what a random
    order would."""
    query, document = first_copies(texts[:, 0]), first_copies(texts[:, 1])
    n = torch.arange(len(query), device=query.device)
    asking, distinct = (query == n).nonzero().flatten(), (document == n).nonzero().flatten()
    position = torch.full_like(n, -1).scatter_(0, distinct, torch.arange(len(distinct), device=n.device))
    docs, rows = corpus[distinct].double(), []
    block = max(1, QUERY_BLOCK // max(1, len(distinct)))  # queries a block: its (q, D) tensors bounded
    for start in range(0, len(asking), block):
        ask = asking[start : start + block]
        relevant = torch.zeros(len(ask), len(distinct), dtype=torch.bool, device=n.device)
        own = (query[None, :] == ask[:, None]).nonzero()  # (each asked query's rows)
        relevant[own[:, 0], position[document[own[:, 1]]]] = True  # each query text's documents
        rows.append(ranked_values(queries[ask].double() @ docs.T, relevant, metrics))
    return {name: mean_of([r[name] for r in rows]) for name in metrics}


QUERY_BLOCK = 1 << 22  # elements of a block's (queries, documents) tensors: 32 MB of float64 each


def mean_of(parts: list[Tensor]) -> Tensor:
    """The mean of per-row values given in parts (NaN: none)."""
    return torch.cat(parts).mean().float() if parts else torch.tensor(math.nan)


def ranked_metrics(
    scores: Tensor, relevant: Tensor, metrics: list[str], present: Tensor | None = None
) -> dict[str, Tensor]:
    """Each row a query ranking its documents by `scores` (Q, D), `relevant` (Q, D) marking its
    relevant ones (one at least) and `present` the documents it has (default: all): MRR@10 (1 / the
    first relevant one's place), nDCG@10 (binary gains 1/log2(place + 1), over those of the ideal
    order of min(R, 10)) and recall@1 and @10 (the share of the row's R relevant ones found there),
    as MTEB and sentence-transformers' `InformationRetrievalEvaluator` score a query; means over the
    rows. Scores that tie (`tied` with the one ranked next above: the last bits of a score depend on
    the batch it was computed in) are in a random order, each figure its mean over those orders. A
    row with a NaN score (a model's NaN vector) scores NaN; no row, NaN."""
    values = ranked_values(scores, relevant, metrics, present)
    return {name: mean_of([values[name]]) for name in metrics}


def ranked_values(
    scores: Tensor, relevant: Tensor, metrics: list[str], present: Tensor | None = None
) -> dict[str, Tensor]:
    """`ranked_metrics`' figures, each row's (Q,), float64."""
    if scores.numel() == 0:
        return {name: scores.new_zeros(0, dtype=torch.float64) for name in metrics}
    present = torch.ones_like(relevant) if present is None else present
    order = scores.nan_to_num(nan=-math.inf).argsort(dim=1, descending=True, stable=True)
    order = order.gather(1, (~present).gather(1, order).argsort(dim=1, stable=True))  # absent: last
    ranked, hit, there = scores.gather(1, order), relevant.gather(1, order).double(), present.gather(1, order)
    new = torch.ones_like(hit, dtype=torch.bool)  # where a block of tied scores starts
    new[:, 1:] = ~tied(ranked[:, 1:], ranked[:, :-1]) | ~there[:, 1:]  # an absent one ties with none
    block = new.long().cumsum(dim=1) - 1
    at = torch.arange(new.shape[1], device=new.device).expand_as(new)
    first = ranked.gather(1, torch.where(new, at, 0).cummax(dim=1).values)  # each block's first score
    chained = ((first - ranked).double() > TIE * first.double().abs().clamp(min=1.0)).any(dim=1)
    for q in chained.nonzero().flatten().tolist():  # a block spanning more than TIE: cut as `ranks` cuts
        new[q] = cut_runs(-ranked[q].double().cpu(), new[q].cpu()).to(new.device)
        block[q] = new[q].long().cumsum(0) - 1
    size = torch.zeros_like(hit).scatter_add_(1, block, torch.ones_like(hit)).gather(1, block)
    found = torch.zeros_like(hit).scatter_add_(1, block, hit).gather(1, block)
    place = torch.arange(1, hit.shape[1] + 1, device=hit.device, dtype=hit.dtype).expand_as(hit)
    before = torch.where(new, place - 1, 0.0).cummax(dim=1).values  # the places above each block
    share = found / size  # each place's chance of holding a relevant document
    count = hit.sum(dim=1)
    gain = torch.where(place <= 10, 1 / torch.log2(place + 1), 0.0)
    ideal = gain[0, :10].cumsum(0)[count.clamp(1, 10).long() - 1]
    values = {
        "ndcg@10": (share * gain).sum(dim=1) / ideal,
        "recall@1": share[:, :1].sum(dim=1) / count,
        "recall@10": share[:, :10].sum(dim=1) / count,
    }
    if "mrr@10" in metrics:  # the first relevant one, among k in a block of m above which a lie:
        first = hit.argmax(dim=1, keepdim=True)  # at a + j with chance C(m - j, k - 1) / C(m, k)
        a, m, k = before.gather(1, first), size.gather(1, first), found.gather(1, first)
        j = torch.arange(1, 11, device=hit.device, dtype=hit.dtype)
        rest = (m - j).clamp(min=k - 1)
        chance = (log_choose(rest, k - 1) - log_choose(m, k)).exp()
        values["mrr@10"] = torch.where((m - j >= k - 1) & (a + j <= 10), chance / (a + j), 0.0).sum(dim=1)
    broken = (scores.isnan() & present).any(dim=1)
    return {name: values[name].masked_fill(broken, math.nan) for name in metrics}


def log_choose(n: Tensor, r: Tensor) -> Tensor:
    """log C(n, r) of whole numbers 0 <= r <= n, as floats."""
    return torch.lgamma(n + 1) - torch.lgamma(r + 1) - torch.lgamma(n - r + 1)


def first_below(values: Tensor, threshold: Tensor) -> Tensor:
    """Each row's first index whose value is below its `threshold` (NaN never is), -1 for none."""
    below = values < threshold
    first = below.long().argmax(dim=1)
    return torch.where(below.any(dim=1), first, -1)


def step_metric_values(probabilities: Tensor, threshold: Tensor, labels: Tensor) -> dict[str, Tensor]:
    """The step metrics (see the module docstring) of solutions' step probabilities (N, W) judged
    at `threshold` (N, 1), against their labels (N, W), NaN where unlabelled. A label below 0.5 is
    a wrong step."""
    labelled = ~labels.isnan()
    wrong = labelled & (labels < 0.5)
    judged = probabilities < threshold
    hits = (judged == wrong)[labelled].double()
    tp = (judged & wrong).sum().double()
    predicted, actual = (judged & labelled).sum().double(), wrong.sum().double()
    f1_wrong = 2 * tp / (predicted + actual) if predicted + actual > 0 else tp.new_tensor(0.0)
    tp_right, right = (~judged & labelled & ~wrong).sum().double(), (labelled & ~wrong).sum().double()
    judged_right = (~judged & labelled).sum().double()
    f1_right = 2 * tp_right / (judged_right + right) if judged_right + right > 0 else tp.new_tensor(0.0)
    first = first_below(probabilities, threshold)
    true_first = first_below(torch.where(labelled, labels, math.nan), torch.full_like(threshold, 0.5))
    match = (first == true_first).double()
    erroneous = true_first >= 0
    on_errors, on_correct = match[erroneous].mean(), match[~erroneous].mean()
    if on_errors.isnan() or on_correct.isnan():  # one side only: its accuracy (as `choose` reads it)
        processbench = on_correct if on_errors.isnan() else on_errors
    else:
        both = on_errors + on_correct
        processbench = 2 * on_errors * on_correct / both if both > 0 else both
    return {
        "step_accuracy": hits.mean(),
        "step_f1": f1_wrong,
        "prmscore": (f1_wrong + f1_right) / 2,
        "first_error_accuracy": match.mean(),
        "processbench_f1": processbench,
    }
