"""The capstone data: tickets → issue category, chat rendering, label masking, collation, token-weighted loss.

``tickets``: the data set (written for this course; see DATASHEET.md) and ``prompt_messages``.
``prompts``: the prompt styles the capstone compares (plain, labels with definitions, few-shot).
``batching``: chat-template rendering with assistant-only labels (-100 elsewhere), right-padding
collation, and the token-weighted loss across gradient-accumulation micro-batches (lesson 04).
"""

from .batching import (
    IGNORE_INDEX,
    EmptyBatchError,
    TemplatePrefixError,
    collate,
    count_supervised,
    encode_example,
    end_of_turn_id,
    micro_batch_loss,
    num_items_in_window,
    render_ids,
    token_loss_sum,
    window_loss,
)
from .tickets import (
    HELDOUT_MACHINES,
    HELDOUT_SPLITS,
    HELDOUT_TEMPLATES,
    LABEL_DEFINITIONS,
    LABELS,
    NEAR_DUP_JACCARD,
    PROMPT_PREFIX,
    SYMPTOMS,
    TRAIN_MACHINES,
    TRAIN_TEMPLATES,
    chat_example,
    counts_table,
    label_counts,
    load_split,
    make_splits,
    max_cross_split_jaccard,
    prompt_messages,
)

__all__ = [
    "IGNORE_INDEX", "EmptyBatchError", "TemplatePrefixError", "collate", "count_supervised",
    "encode_example", "end_of_turn_id", "micro_batch_loss", "num_items_in_window", "render_ids",
    "token_loss_sum", "window_loss",
    "HELDOUT_MACHINES", "HELDOUT_SPLITS", "HELDOUT_TEMPLATES", "LABEL_DEFINITIONS", "LABELS", "NEAR_DUP_JACCARD",
    "PROMPT_PREFIX", "SYMPTOMS", "TRAIN_MACHINES", "TRAIN_TEMPLATES", "chat_example",
    "counts_table", "label_counts", "load_split", "make_splits", "max_cross_split_jaccard",
    "prompt_messages", "datasheet_text",
]


def datasheet_text() -> str:
    """The shipped DATASHEET.md as a string."""
    from importlib.resources import files

    return files(__name__).joinpath("DATASHEET.md").read_text(encoding="utf-8")
