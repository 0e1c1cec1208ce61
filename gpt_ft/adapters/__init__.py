"""Task adapters: a labelled example in, GPT-1's delimited token sequences out (paper §3.3), and
the head that turns them into the task's outputs.

One class per input shape:

- `SingleText`:     [start] text [extract]                               (CoLA, SST-2)
- `TextPair`:       [start] premise [delim] hypothesis [extract]         (MNLI, QNLI, RTE, SNLI, ...)
- `Similarity`:     both orders [start] a [delim] b [extract], summed    (MRPC, STS-B, QQP)
- `MultipleChoice`: [start] context [delim] answer_k [extract] per k     (Story Cloze, RACE, SWAG, ARC)
- `FillIn`:         [start] sentence to its blank [delim] option_k and   (WinoGrande)
                    the rest [extract] per option
- `CauseEffect`:    [start] premise because|therefore [delim] choice_k   (COPA)
                    [extract] per choice
- `MultiLabel`:     [start] text [extract], one sigmoid per label        (GoEmotions)
- `Preference`:     [start] prompt [delim] reply [extract] per reply,    (HH-RLHF: reward models)
                    chosen first, Bradley-Terry's loss on two rewards
- `Embedding`:      [start] text [extract] per text: anchor, positive,   (STS-B, retrieval pairs)
                    hard negatives; one vector each, InfoNCE or CoSENT
- `Reranker`:       [start] query [delim] text [extract] per candidate,  (reranking)
                    the positive first; one score each, listwise
- `Ranking`:        [start] prompt [delim] reply [extract] per reply     (RewardBench 2, UltraFeedback:
                    of N; a listwise loss over their rewards              rankings, best-of-N)
- `Steps`:          [start] problem [delim] step_1 [extract] step_2      (process rewards: PRMBench,
                    [extract] ...; a verdict read after every step        ProcessBench, Math-Shepherd)
- `Answers`:        [start] context [delim] answer_k [extract] per       (MultiRC)
                    answer, each judged right or wrong on its own
- `Cloze`:          [start] passage [delim] query, candidate_k in its    (ReCoRD)
                    placeholder [extract] per candidate; softmax, several right

What a task predicts per example is its output kind (`outputs.py`, or its shape's module):
`ClassificationOutput`, `RegressionOutput` (`regression: true`), `ChoiceOutput` (multiple choice),
`MultiLabelOutput` or `PreferenceOutput`, `EmbeddingOutput`, `RerankOutput`, `RankingOutput`,
`StepOutput`, `AnswerOutput` or `ClozeOutput`.
Each brings its head (`heads.py`), label reading, metrics and written predictions.

A task card (tasks/*.yaml) is a `class_path` + `init_args` value for a `TaskAdapter`-typed
argument, so a user's own adapter class works with nothing registered; shipped cards name
`gpt_ft.adapters.X`.
"""

from gpt_ft.adapters.answers import AnswerOutput, Answers, MultiRC
from gpt_ft.adapters.base import ENCODING, Encoded, Submission, TaskAdapter
from gpt_ft.adapters.choice import CauseEffect, ChoiceOutput, FillIn, MultipleChoice
from gpt_ft.adapters.cloze import Cloze, ClozeOutput, ReCoRD
from gpt_ft.adapters.embedding import Embedding, EmbeddingHead, EmbeddingOutput
from gpt_ft.adapters.heads import ChoiceHead, ClassificationHead, RegressionHead, StepHead, TaskHead
from gpt_ft.adapters.metrics import METRICS, Scoring, metric_value
from gpt_ft.adapters.multilabel import MultiLabel, MultiLabelHead, MultiLabelOutput
from gpt_ft.adapters.nli import NliTriplets
from gpt_ft.adapters.outputs import (
    ClassificationOutput,
    LabelSpec,
    RegressionOutput,
    TaskDataError,
    TaskOutput,
)
from gpt_ft.adapters.preference import Preference, PreferenceOutput, RewardHead
from gpt_ft.adapters.ranking import Ranking, RankingHead, RankingOutput
from gpt_ft.adapters.rerank import Reranker, RerankHead, RerankOutput
from gpt_ft.adapters.rewardbench import RewardBench2, RewardBench2Output
from gpt_ft.adapters.sources import HubDataset, LocalFiles, Sources, field_text
from gpt_ft.adapters.steps import StepOutput, Steps
from gpt_ft.adapters.text import Similarity, SingleText, TextPair
from gpt_ft.adapters.truncation import fit_lengths

__all__ = [
    "TaskAdapter",
    "SingleText",
    "TextPair",
    "Similarity",
    "MultipleChoice",
    "FillIn",
    "CauseEffect",
    "MultiLabel",
    "Preference",
    "Embedding",
    "NliTriplets",
    "Reranker",
    "Steps",
    "Answers",
    "MultiRC",
    "Cloze",
    "ReCoRD",
    "Ranking",
    "RankingOutput",
    "RankingHead",
    "RewardBench2",
    "RewardBench2Output",
    "StepOutput",
    "AnswerOutput",
    "ClozeOutput",
    "StepHead",
    "RerankOutput",
    "RerankHead",
    "EmbeddingOutput",
    "EmbeddingHead",
    "Sources",
    "HubDataset",
    "LocalFiles",
    "LabelSpec",
    "Scoring",
    "Submission",
    "Encoded",
    "ENCODING",
    "TaskDataError",
    "TaskOutput",
    "ClassificationOutput",
    "RegressionOutput",
    "ChoiceOutput",
    "MultiLabelOutput",
    "PreferenceOutput",
    "TaskHead",
    "ClassificationHead",
    "RegressionHead",
    "ChoiceHead",
    "MultiLabelHead",
    "RewardHead",
    "METRICS",
    "metric_value",
    "field_text",
    "fit_lengths",
]
