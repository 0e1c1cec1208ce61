"""Preference pairs: a prompt and two replies, the chosen one first; one reward per reply.

A reward model is GPT-1's multiple choice with two choices (§3.3): [start] prompt [delim] reply
[extract] per reply, the prompt encoded once (`--data.shared_context`, packed batches alike). One
linear layer scores each extract state; the loss is Bradley-Terry's,

    -log σ(r_chosen - r_rejected - margin),

which is the cross-entropy of a softmax over the two scores with the chosen one right (margin 0).
An optional margin field asks for a wider gap on some pairs (Llama 2's margin loss), and
`center_rewards` adds c·(r_chosen + r_rejected)² per pair, which keeps the rewards near zero
(TRL's `center_rewards_coefficient`).

A row holds `chosen` and `rejected` (and `prompt`, where the data has one). Where the dialogue and
the reply come in one text (Anthropic's HH-RLHF), the card names the turn marker before each reply
and the shared dialogue is split off at the last marker both texts share (`split_dialogue`). Where
they are chat messages ([{role, content}, ...], as UltraFeedback's), the messages both lists start
with are the prompt and the rest the reply, rendered through the tokenizer's chat template where it
has one (`render_messages`). A row with a `reply` field instead is one reply to score
(`Classifier`, `gpt-ft label`).

Scored by pairwise accuracy (the share of pairs whose chosen reply gets the higher reward, a tie
counting half) and the mean margin r_chosen - r_rejected over the pairs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters.base import Encoded, TaskAdapter, refuse_label_fields
from gpt_ft.adapters.heads import ChoiceHead, at_least_fp32, tied
from gpt_ft.adapters.outputs import CardError, LabelSpec, TaskDataError, TaskOutput, score_text
from gpt_ft.adapters.sources import field_text, finite_number, short_repr


def split_dialogue(chosen: str, rejected: str, marker: str) -> tuple[str, str, str]:
    """(prompt, chosen reply, rejected reply): the two texts' shared dialogue up to and including
    the last `marker` inside their common prefix, and what follows it in each.

    Only a marker both texts share counts, so a reply that itself holds the marker (a reply that
    writes the next turn) is not cut there. Identical texts split at their last marker. Texts that
    share no marker have an empty prompt: each reply is its whole text.
    """
    common = len(os.path.commonprefix([chosen, rejected]))
    at = chosen.rfind(marker, 0, common)
    cut = at + len(marker) if at >= 0 else 0
    return chosen[:cut], chosen[cut:], rejected[cut:]


def split_reply(text: str, marker: str) -> tuple[str, str]:
    """(prompt, reply) of one dialogue: split after its last `marker` (no marker: no prompt)."""
    at = text.rfind(marker)
    cut = at + len(marker) if at >= 0 else 0
    return text[:cut], text[cut:]


def chat_messages(value: Any, field: str) -> list[dict[str, str]] | None:
    """A field's value as chat messages ({role, content} each), None for a text; another list is
    named in one sentence."""
    if not isinstance(value, (list, tuple)):
        return None
    well_formed = all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )
    if not value or not well_formed:
        raise TaskDataError(
            f"field {field!r} holds {short_repr(value)}, not a text or chat messages "
            "([{'role': ..., 'content': ...}, ...])."
        )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def render_messages(
    prompt: list[dict[str, str]], reply: list[dict[str, str]], tokenizer=None
) -> tuple[str, str]:
    """(prompt, reply) as texts. With a tokenizer that has a chat template: the prompt rendered with
    its generation prompt, and the reply what the whole dialogue adds to that. Otherwise each
    message on its own paragraph, "\n\nUser: ..." (HH-RLHF's layout, with the roles' names), the
    prompt ending in "\n\nAssistant:" where the reply is the assistant's."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        from jinja2 import TemplateError

        try:  # a template may refuse a dialogue (Gemma's: a system turn; roles that do not alternate)
            render = lambda turns, **kw: tokenizer.apply_chat_template(turns, tokenize=False, **kw)  # noqa: E731
            head = render(prompt, add_generation_prompt=True) if prompt else ""
            whole = render(prompt + reply)
        except TemplateError as exc:
            raise TaskDataError(f"the tokenizer's chat template refuses these messages: {exc}") from None
        if not whole.startswith(head):
            raise TaskDataError(
                "the tokenizer's chat template does not render the dialogue as its prompt, then the reply."
            )
        return head, whole[len(head) :]
    turn = lambda m: f"\n\n{m['role'].capitalize()}: {m['content']}"  # noqa: E731
    text = "".join(turn(m) for m in prompt)
    if prompt and reply[0]["role"] == "assistant":
        return text + "\n\nAssistant:", " " + reply[0]["content"] + "".join(turn(m) for m in reply[1:])
    return text, "".join(turn(m) for m in reply)


def reply_templates(self: TaskAdapter, specials) -> tuple[str, str]:
    """A reward model's `template`s (`Preference`, `Ranking`): a prompt and its reply, and a reply
    alone, framed as training frames a reply to no prompt: `[start] [delim] reply [extract]`."""
    start, delim, extract = specials
    return f"{start} {delim} $A {extract}", TaskAdapter.template(self, specials)[1]


class RewardHead(ChoiceHead):
    """One reward per reply from one linear layer; Bradley-Terry's loss on a pair, chosen first."""

    def __init__(
        self,
        n_embd: int,
        *,
        center_rewards: float = 0.0,
        dropout: float = 0.1,
        init_std: float = 0.02,
        bias: bool = True,
    ) -> None:
        super().__init__(n_embd, dropout=dropout, init_std=init_std, bias=bias)
        self.center_rewards = center_rewards

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        """-log σ(r_chosen - r_rejected - margin) per pair, `labels` the margins (B,), plus
        `center_rewards`·(r_chosen + r_rejected)²."""
        rewards = at_least_fp32(outputs)
        gap = rewards[:, 0] - rewards[:, 1]
        losses = F.softplus(labels.float() - gap)  # -log σ(x) = softplus(-x), exact in both tails
        if self.center_rewards:
            losses = losses + self.center_rewards * (rewards[:, 0] + rewards[:, 1]) ** 2
        return losses

    def predictions(self, outputs: Tensor) -> Tensor:
        """The rewards (B, 2), fp32; NaN for a reply the row does not have (one to score)."""
        missing = outputs == torch.finfo(outputs.dtype).min  # ChoiceHead's mask
        rewards = outputs.float().masked_fill(missing, math.nan)
        return F.pad(rewards, (0, 2 - rewards.shape[1]), value=math.nan)  # a batch of single replies

    def probabilities(self, outputs: Tensor) -> Tensor:
        return self.predictions(outputs)


class PreferenceOutput(TaskOutput):
    """A pair's two rewards, the chosen reply first: Bradley-Terry's loss, scored by pairwise
    accuracy (`accuracy`) and the mean margin (`margin`). The label is the pair's margin (0 unless
    the card names a margin field)."""

    kind = "preference"
    problem_type = "regression"  # one reward per sequence: num_labels 1, as reward models are served
    served_per_sequence = True  # [start] prompt [delim] reply [extract]: one reply's reward
    has_probabilities = False
    allowed_metrics = default_metrics = ("accuracy", "margin")
    default_lm_coef = 0.0

    def __init__(
        self,
        task_name: str,
        spec: LabelSpec,
        *,
        center_rewards: float,
        sides: tuple[str, str],
        reply: str = "reply",
        margin: str | None = None,
    ) -> None:
        super().__init__(task_name, spec)
        if spec.names:
            raise CardError(f"Task {task_name!r}: a preference task takes no `labels`.")
        if not (center_rewards >= 0 and math.isfinite(center_rewards)):
            raise CardError(f"Task {task_name!r}: center_rewards must be >= 0, got {center_rewards}.")
        self.center_rewards, self.sides = center_rewards, sides
        self.reply, self.margin = reply, margin

    @property
    def num_outputs(self) -> int:
        return 1

    def served_labels(self) -> list[str]:
        return ["reward"]

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> RewardHead:
        return RewardHead(
            n_embd, center_rewards=self.center_rewards, dropout=dropout, init_std=init_std, bias=bias
        )

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        """Pairwise accuracy (a tie, rewards within `TIE`, counts half: the same reply placed elsewhere
        in a packed row scores a few last bits apart) and the mean of r_chosen - r_rejected."""
        gap = (predictions[:, 0] - predictions[:, 1]).double()
        tie = tied(predictions[:, 0], predictions[:, 1])
        values = {
            "accuracy": (((gap > 0) & ~tie).double() + 0.5 * tie.double()).mean(),
            "margin": gap.mean(),
        }
        return {name: values[name].float() for name in metrics}

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        """A pair: its margin r_chosen - r_rejected, 0 for a tie (as accuracy counts it); one reply:
        its reward. Six significant digits: the sign of a margin that is not a tie is kept."""
        first, second = prediction.tolist()
        if math.isnan(second):
            return score_text(first)
        return "0" if tied(prediction[:1], prediction[1:]).item() else score_text(first - second)

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        """One reply: its reward (as `label` and `scores`). A pair: the preferred side's field name
        (the first on a tie, as accuracy counts one), both rewards, and P(first ≻ second) =
        σ(r_first - r_second)."""
        first, second = prediction.tolist()
        if math.isnan(second):
            return {"label": first, "scores": first}
        first_wins = first >= second or bool(tied(prediction[:1], prediction[1:]))
        return {
            "label": self.sides[0] if first_wins else self.sides[1],
            "scores": dict(zip(self.sides, (first, second))),
            "probability": 1 / (1 + math.exp(min(second - first, 700.0))),
        }

    def label_text(self, label: Any) -> Any:
        """A pair as `gpt-ft explain` shows it: which reply is preferred, and by what margin if any."""
        if label is None:
            return None
        preferred = f"{self.sides[0]} preferred to {self.sides[1]}"
        return f"{preferred}, margin {score_text(label)}" if label else preferred

    def example_label(self, example: dict[str, Any]) -> float | None:
        """A pair's margin (0 without a margin field or value); None for one reply (a `reply`
        field and no chosen one)."""
        if one_reply(example, self.reply, self.sides[0]):
            return None
        if self.margin is None or (value := example.get(self.margin)) is None or value != value:  # NaN: null
            return 0.0
        return self.label_id(example[self.margin])

    def label_id(self, value: Any) -> float:
        """A margin: a finite number."""
        self._missing(value)
        return finite_number(value, "margin", self.spec.field)


class Preference(TaskAdapter):
    """Two replies to one prompt, the chosen one first: [start] prompt [delim] reply [extract] each,
    one reward per reply, Bradley-Terry's loss (see the module docstring)."""

    shares_context = True
    num_sequences = 2
    renders_chats = True
    keeps_context_end = True

    def __init__(
        self,
        *,
        chosen: str = "chosen",
        rejected: str = "rejected",
        prompt: str | None = None,
        turn_marker: str | None = None,
        reply: str = "reply",
        margin: str | None = None,
        center_rewards: float = 0.0,
        **kwargs,
    ) -> None:
        """
        Args:
            chosen: Field holding the preferred reply (or, with `turn_marker`, the whole dialogue
                ending in it; or the dialogue as chat messages, the prompt field then not read).
            rejected: Field holding the other reply (or dialogue).
            prompt: Field holding the prompt the replies answer; None: the replies hold it
                (`turn_marker`), or there is none.
            turn_marker: The text before each reply in a dialogue (HH-RLHF: "\\n\\nAssistant:"):
                the prompt is the dialogue up to the last marker that `chosen` and `rejected`
                share, the replies what follows it.
            reply: Field of a row that holds one reply to score instead of a pair (with the
                prompt, or as a dialogue split at its last `turn_marker`).
            margin: Field with each pair's margin in the loss; None: 0 for every pair.
            center_rewards: Weight c of c·(r_chosen + r_rejected)² added to each pair's loss
                (TRL's `center_rewards_coefficient`; 0.01 is its suggestion), 0 for none.
        """
        name = kwargs.get("name")
        if prompt is not None and turn_marker is not None:
            raise CardError(f"Task {name!r}: give `prompt` (a field) or `turn_marker`, not both.")
        if turn_marker == "":
            raise CardError(f"Task {name!r}: turn_marker must not be empty.")
        # The base class's label arguments, at their defaults where the card leaves them out.
        defaults = {"label": "label", "labels": None, "regression": False, "score_range": None}
        refuse_label_fields(
            kwargs,
            {**defaults, "ignore_labels": None},
            "a preference task takes no `{field}` (the chosen reply is the right one; `margin` names a "
            "field with each pair's margin).",
        )
        self.chosen, self.rejected, self.prompt, self.reply = chosen, rejected, prompt, reply
        self.turn_marker, self.margin, self.center_rewards = turn_marker, margin, center_rewards
        super().__init__(label=margin or "margin", **kwargs)

    @property
    def label_column(self) -> str | None:  # type: ignore[override]
        return self.margin

    @property
    def label_source(self) -> str:
        sides = f"a pair: fields {self.chosen!r} and {self.rejected!r}"
        return sides + (f", and {self.margin!r}" if self.margin else "")

    template = reply_templates

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        sides = (self.chosen, self.rejected)
        return PreferenceOutput(
            self.name,
            spec,
            center_rewards=self.center_rewards,
            sides=sides,
            reply=self.reply,
            margin=self.margin,
        )

    def text_fields(self) -> list[str]:
        return ([self.prompt] if self.prompt else []) + [self.chosen, self.rejected]

    def _pair(self, example: dict[str, Any]) -> bool:
        """A pair to compare, or else (a `reply` and no `chosen`) one reply to score."""
        return not one_reply(example, self.reply, self.chosen)

    _chat = None
    """The tokenizer whose chat template renders message lists, while `encode_examples` runs."""

    def encode_examples(self, examples, tokenizer, specials, max_length: int, *, where=None):
        self._chat = tokenizer if getattr(tokenizer, "chat_template", None) else None
        try:
            return super().encode_examples(examples, tokenizer, specials, max_length, where=where)
        finally:
            del self._chat  # the card's fields alone stay in vars(self) (the encodings' fingerprint)

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[prompt, chosen, rejected], or [prompt, reply] for one reply."""
        sides = [self.chosen, self.rejected] if self._pair(example) else [self.reply]
        messages = [chat_messages(example[f], f) for f in sides]  # a missing field: its name
        if any(m is not None for m in messages):
            return self._message_texts(messages, sides)
        # (a card without a prompt: none)
        prompt = field_text(example[self.prompt], self.prompt) if self.prompt else ""
        if not self._pair(example):
            reply = _text(example, self.reply)
            if self.turn_marker is not None:
                prompt, reply = split_reply(reply, self.turn_marker)
            return [prompt, reply]
        chosen, rejected = _text(example, self.chosen), _text(example, self.rejected)
        if self.turn_marker is not None:
            return list(split_dialogue(chosen, rejected, self.turn_marker))
        return [prompt, chosen, rejected]

    def _message_texts(self, messages: list, sides: list[str]) -> list[str]:
        """[prompt, reply, ...] of chat messages: the messages every side starts with (all but the
        last one at most) are the prompt."""
        chat = next(side for side, m in zip(sides, messages) if m is not None)
        for side, m in zip(sides, messages):
            if m is None:
                raise TaskDataError(f"field {side!r} holds a text where {chat!r} holds chat messages.")
        n = min(len(m) - 1 for m in messages)
        shared = next((i for i in range(n) if any(m[i] != messages[0][i] for m in messages)), n)
        rendered = [render_messages(messages[0][:shared], m[shared:], self._chat) for m in messages]
        return [rendered[0][0], *(reply for _, reply in rendered)]

    def encode(self, example, tokens, specials, max_length):
        prompt, *replies = tokens
        sequences, extract = self.choice_sequences(specials, prompt, replies, max_length)
        return Encoded(sequences, extract, self.output.example_label(example))


def _text(example: dict[str, Any], field: str) -> str:
    """A reply's text: a value that is missing or not a text is named."""
    value = example[field]
    if isinstance(value, (list, tuple, dict)):
        raise TaskDataError(f"field {field!r} holds {type(value).__name__} {short_repr(value)}, not a text.")
    return field_text(value, field, needed="a pair needs both replies")


def one_reply(example: dict[str, Any], reply: str, chosen: str) -> bool:
    """Whether a row is one reply to score: its `reply` holds a value and its `chosen` none (absent,
    null or empty, as in a table whose other rows are pairs)."""
    return example.get(reply) not in ("", None) and example.get(chosen) in ("", None)
