"""The seed's four instruction data sets (torchtune's, seed 000 §5.2): each record becomes a list
of (text, trained) segments; prompt segments are not trained (their labels are -100).

Templates follow torchtune's for the same data sets (Alpaca's is Stanford Alpaca's own), so our
token counts per example match what the seed's runs tokenised.
"""

from __future__ import annotations

from collections.abc import Callable

from paratrain.errors import DataError

Segments = list[tuple[str, bool]]

ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
GRAMMAR = "Correct this to standard English: {input}\n---\nCorrected: "
SAMSUM = "Summarize this dialogue:\n{dialogue}\n---\nSummary:\n"
# ShareGPT turns in a Llama-3-style layout (used when the tokenizer has no chat template).
TURN = "<|start_header_id|>{role}<|end_header_id|>\n\n"
END_OF_TURN = "<|eot_id|>"
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}


def _field(record: dict, name: str, where: str) -> str:
    if name not in record:
        raise DataError(
            f"{where}: missing field {name!r} (has: {', '.join(sorted(record)) or 'none'})"
        )
    value = record[name]
    if not isinstance(value, str):
        raise DataError(f"{where}: field {name!r} must be text, got {type(value).__name__}")
    return value


def alpaca(record: dict, where: str) -> Segments:
    instruction, output = _field(record, "instruction", where), _field(record, "output", where)
    extra = record.get("input") or ""
    prompt = (ALPACA_WITH_INPUT if extra else ALPACA_NO_INPUT).format(
        instruction=instruction, input=extra
    )
    return [(prompt, False), (output, True)]


def grammar(record: dict, where: str) -> Segments:
    return [
        (GRAMMAR.format(input=_field(record, "input", where)), False),
        (_field(record, "output", where), True),
    ]


def samsum(record: dict, where: str) -> Segments:
    return [
        (SAMSUM.format(dialogue=_field(record, "dialogue", where)), False),
        (_field(record, "summary", where), True),
    ]


def slimorca(record: dict, where: str) -> Segments:
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: missing field 'conversations' (a list of {{from, value}} turns)")
    segments: Segments = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: conversations[{i}] must be a {{from, value}} object")
        role = SHAREGPT_ROLES.get(_field(turn, "from", f"{where} conversations[{i}]"))
        if role is None:
            raise DataError(
                f"{where}: conversations[{i}].from must be one of {', '.join(SHAREGPT_ROLES)}"
            )
        value = _field(turn, "value", f"{where} conversations[{i}]")
        # Only the model's own turns are trained; the header before them is prompt.
        segments.append((TURN.format(role=role), False))
        segments.append((value + END_OF_TURN, role == "assistant"))
    if not any(trained for _, trained in segments):
        raise DataError(f"{where}: conversation has no 'gpt' turn to train on")
    return segments


FORMATS: dict[str, Callable[[dict, str], Segments]] = {
    "alpaca": alpaca,
    "grammar": grammar,
    "samsum": samsum,
    "slimorca": slimorca,
}
