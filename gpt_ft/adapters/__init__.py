"""Task adapters: a labelled example in, GPT-1's delimited token sequences out (paper §3.3), and
the head that turns them into the task's outputs.

One class per input shape:

- `SingleText`:     [start] text [extract]                               (CoLA, SST-2)
- `TextPair`:       [start] premise [delim] hypothesis [extract]         (MNLI, QNLI, RTE, SNLI, ...)
- `Similarity`:     both orders [start] a [delim] b [extract], summed    (MRPC, STS-B, QQP)
- `MultipleChoice`: [start] context [delim] answer_k [extract] per k     (Story Cloze, RACE, SWAG)
- `MultiLabel`:     [start] text [extract], one sigmoid per label        (GoEmotions)

A task card (tasks/*.yaml) is a `class_path` + `init_args` value for a `TaskAdapter`-typed
argument, so a user's own adapter class works with nothing registered; shipped cards name
`gpt_ft.adapters.X`.
"""

from gpt_ft.adapters.base import (
    Encoded,
    HubDataset,
    LocalFiles,
    TaskAdapter,
    TaskDataError,
    field_text,
    fit_lengths,
)
from gpt_ft.adapters.choice import MultipleChoice
from gpt_ft.adapters.heads import ChoiceHead, ClassificationHead, RegressionHead, TaskHead
from gpt_ft.adapters.metrics import METRICS, metric_value
from gpt_ft.adapters.multilabel import MultiLabel
from gpt_ft.adapters.text import Similarity, SingleText, TextPair

__all__ = [
    "TaskAdapter",
    "SingleText",
    "TextPair",
    "Similarity",
    "MultipleChoice",
    "MultiLabel",
    "HubDataset",
    "LocalFiles",
    "Encoded",
    "TaskDataError",
    "TaskHead",
    "ClassificationHead",
    "RegressionHead",
    "ChoiceHead",
    "METRICS",
    "metric_value",
    "field_text",
    "fit_lengths",
]
