"""How a ticket becomes a prompt: the prompt styles the capstone compares.

* ``"plain"``: ``prompt_messages(ticket)``, "Return the issue category for: <ticket>". The prompt the
  adapters are trained and evaluated with. It never names the six labels, so an untrained model
  cannot be expected to answer with one: it is the training format, not a baseline.
* ``"definitions"``: an instruction, the six labels with their one-line definitions, then the ticket
  (zero-shot). The prompt a reasonable person writes first (the "improve the prompt" row of lesson 01).
* ``"few_shot"``: the same instruction and definitions, then ``k`` solved training tickets as earlier
  chat turns (user: ticket, assistant: label), then the ticket. ``few_shot_examples(k)`` picks the
  shots from the training split, cycling through the labels so every label is shown.
* ``"system_definitions"`` and ``"system_few_shot"``: the same two prompts with the instruction and the
  definitions in a system turn (replacing SmolLM2's default system prompt) and only tickets in user turns.

The four styles other than ``"plain"`` are :data:`LAYOUTS`, the prompt layouts the capstone's baseline search
tries. :data:`CONTENT_FREE` is the ticket text of a content-free input, for calibration (Zhao et al. 2021,
"Calibrate Before Use: Improving Few-Shot Performance of Language Models", arXiv:2102.09690).

Every style renders through the model's own chat template (``coursekit.data.render_ids``). Each style's
prompts for different tickets share a long common prefix (system turn, instruction, definitions, shots);
``coursekit.evaluate`` computes that prefix once and reuses its keys and values for every ticket.
"""

from __future__ import annotations

from typing import Any, Sequence

from .tickets import LABEL_DEFINITIONS, LABELS, load_split, prompt_messages

__all__ = ["PROMPT_STYLES", "LAYOUTS", "CONTENT_FREE", "INSTRUCTION", "definitions_messages",
           "system_definitions_messages", "few_shot_examples", "few_shot_messages", "system_few_shot_messages",
           "style_messages"]

PROMPT_STYLES: tuple[str, ...] = ("plain", "definitions", "system_definitions", "few_shot", "system_few_shot")
#: The baseline prompt layouts: every style but the training prompt, which never names the labels.
LAYOUTS: tuple[str, ...] = PROMPT_STYLES[1:]
#: A ticket that says nothing (Zhao et al. 2021 use "N/A"): the labels' scores after it measure the prompt's own bias.
CONTENT_FREE = "N/A"

INSTRUCTION = ("Classify the maintenance ticket into exactly one of these categories. "
               "Answer with the category name only, in lowercase.")


def _definitions_block() -> str:
    return "\n".join(f"- {label}: {LABEL_DEFINITIONS[label]}" for label in LABELS)


def _ticket_turn(ticket: str) -> str:
    if not isinstance(ticket, str) or not ticket.strip():
        raise ValueError(f"ticket must be a non-empty string, got {ticket!r}")
    return "Ticket: " + ticket.strip()


def definitions_messages(ticket: str) -> list[dict[str, str]]:
    """Zero-shot prompt: one user turn with the instruction, the six labels and their definitions, the ticket."""
    return [{"role": "user", "content": f"{INSTRUCTION}\n{_definitions_block()}\n\n{_ticket_turn(ticket)}"}]


def system_definitions_messages(ticket: str) -> list[dict[str, str]]:
    """Zero-shot prompt with the instruction and the definitions in the system turn and the ticket alone in the user turn."""
    return [{"role": "system", "content": f"{INSTRUCTION}\n{_definitions_block()}"},
            {"role": "user", "content": _ticket_turn(ticket)}]


def few_shot_examples(k: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """``k`` training examples for a few-shot prompt: the first example of each label in turn (training order),
    so that k = 6 shows every label once. Raises ValueError for k < 1 or k > the training split's size."""
    train = load_split("train", seed)
    if not isinstance(k, int) or not 1 <= k <= len(train):
        raise ValueError(f"k must be an integer in [1, {len(train)}], got {k!r}")
    by_label = {label: [ex for ex in train if ex["label"] == label] for label in LABELS}
    return [by_label[LABELS[i % len(LABELS)]][i // len(LABELS)] for i in range(k)]


def few_shot_messages(ticket: str, shots: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Few-shot prompt: the definitions prompt's first turn carries the first shot; each shot is answered by an
    assistant turn with its label; the last user turn is the ticket. ``shots``: examples with "ticket", "label"."""
    if not shots:
        raise ValueError("a few-shot prompt needs at least one shot; use definitions_messages for zero-shot")
    msgs: list[dict[str, str]] = []
    for i, shot in enumerate(shots):
        head = f"{INSTRUCTION}\n{_definitions_block()}\n\n" if i == 0 else ""
        msgs += [{"role": "user", "content": head + _ticket_turn(shot["ticket"])},
                 {"role": "assistant", "content": shot["label"]}]
    return msgs + [{"role": "user", "content": _ticket_turn(ticket)}]


def system_few_shot_messages(ticket: str, shots: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Few-shot prompt with the instruction and the definitions in the system turn; every user turn is one ticket."""
    if not shots:
        raise ValueError("a few-shot prompt needs at least one shot; use system_definitions_messages for zero-shot")
    msgs = system_definitions_messages(shots[0]["ticket"])
    msgs.append({"role": "assistant", "content": shots[0]["label"]})
    for shot in shots[1:]:
        msgs += [{"role": "user", "content": _ticket_turn(shot["ticket"])}, {"role": "assistant", "content": shot["label"]}]
    return msgs + [{"role": "user", "content": _ticket_turn(ticket)}]


def style_messages(style: str, ticket: str, shots: Sequence[dict[str, Any]] = ()) -> list[dict[str, str]]:
    """The prompt of ``style`` (one of ``PROMPT_STYLES``) for ``ticket``; ``shots`` only for the few-shot styles."""
    if style == "plain":
        return prompt_messages(ticket)
    if style == "definitions":
        return definitions_messages(ticket)
    if style == "system_definitions":
        return system_definitions_messages(ticket)
    if style == "few_shot":
        return few_shot_messages(ticket, shots)
    if style == "system_few_shot":
        return system_few_shot_messages(ticket, shots)
    raise ValueError(f"unknown prompt style {style!r}; expected one of {PROMPT_STYLES}")
