"""Instruction formats, masking, truncation, packing and their errors."""

import json

import pytest
import torch

from paratrain.data.text import data as lmdata
from paratrain.data.text.formats import ALPACA_NO_INPUT, ALPACA_WITH_INPUT, GRAMMAR, SAMSUM
from paratrain.data.text.tokenizer import byte_tokenizer, load_tokenizer
from paratrain.errors import DataError, UserError

TOK = byte_tokenizer()
BOS, EOS = TOK.bos_token_id, TOK.eos_token_id


def enc(text):
    return TOK(text, add_special_tokens=False)["input_ids"]


def expected(prompt, answer):
    p, a = enc(prompt), enc(answer)
    return [BOS, *p, *a, EOS], [-100] * (1 + len(p)) + a + [EOS]


CASES = {
    "alpaca": (
        [
            {"instruction": "Add.", "input": "2 and 3", "output": "5"},
            {"instruction": "Greet.", "input": "", "output": "Hi"},
        ],
        [
            expected(ALPACA_WITH_INPUT.format(instruction="Add.", input="2 and 3"), "5"),
            expected(ALPACA_NO_INPUT.format(instruction="Greet."), "Hi"),
        ],
    ),
    "grammar": (
        [{"input": "he go", "output": "He goes."}],
        [expected(GRAMMAR.format(input="he go"), "He goes.")],
    ),
    "samsum": (
        [{"dialogue": "A: hi\nB: yo", "summary": "They greet."}],
        [expected(SAMSUM.format(dialogue="A: hi\nB: yo"), "They greet.")],
    ),
}


def write(tmp_path, records, suffix):
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize(
    "fmt,suffix", [("alpaca", ".json"), ("grammar", ".jsonl"), ("samsum", ".parquet")]
)
def test_format_masks_the_prompt(tmp_path, fmt, suffix):
    records, want = CASES[fmt]
    path = write(tmp_path, records, suffix)
    got = lmdata.tokenize(
        lmdata.read_records(str(path)), fmt, TOK, max_length=4096, truncation=True, where="t"
    )
    assert got == want


def test_slimorca_trains_only_gpt_turns(tmp_path):
    record = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "2+2?"},
            {"from": "gpt", "value": "4"},
        ]
    }
    path = write(tmp_path, [record], ".json")
    ((ids, labels),) = lmdata.tokenize(
        lmdata.read_records(str(path)), "slimorca", TOK, max_length=4096, truncation=True, where="t"
    )
    trained = TOK.decode([t for t, lab in zip(ids, labels, strict=True) if lab != -100])
    assert trained == "4<|eot_id|><|end_of_text|>"
    assert "Be brief." in TOK.decode(ids) and "2+2?" in TOK.decode(ids)


def test_truncation_and_its_error():
    records = [{"input": "x" * 100, "output": "y"}]
    ((ids, labels),) = lmdata.tokenize(
        records, "grammar", TOK, max_length=50, truncation=True, where="f.json"
    )
    assert len(ids) == len(labels) == 50
    with pytest.raises(DataError, match=r"f.json record 0: \d+ tokens exceed data.max_length=50"):
        lmdata.tokenize(records, "grammar", TOK, max_length=50, truncation=False, where="f.json")


@pytest.mark.parametrize(
    "fmt,record,field",
    [
        ("alpaca", {"instruction": "x"}, "output"),
        ("grammar", {"output": "x"}, "input"),
        ("samsum", {"dialogue": "x"}, "summary"),
        ("slimorca", {"text": "x"}, "conversations"),
    ],
)
def test_missing_field_names_file_record_and_field(fmt, record, field):
    with pytest.raises(DataError, match=rf"data.json record 0: missing field '{field}'"):
        lmdata.tokenize([record], fmt, TOK, max_length=64, truncation=True, where="data.json")


def test_unreadable_and_missing_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="cannot read"):
        lmdata.read_records(str(bad))
    with pytest.raises(DataError, match="no such file"):
        lmdata.read_records(str(tmp_path / "missing.json"))


def test_model_path_without_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="has no tokenizer"):
        load_tokenizer(str(tmp_path))


def test_packing_rows_restart_positions_and_pad():
    examples = [([1, 2, 3], [-100, 2, 3]), ([4, 5], [-100, 5]), ([6, 7, 8, 9], [-100, 7, 8, 9])]
    rows = lmdata.pack(examples, 6, pad_id=0)
    assert [r[0] for r in rows] == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert [r[2] for r in rows] == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert [r[1] for r in rows][0] == [-100, 2, 3, -100, 5, -100] and [r[3] for r in rows] == [5, 4]
    batch = lmdata.Collate(0, packed=True)(rows)
    assert batch["num_tokens"].item() == 9 and "attention_mask" not in batch


def test_padded_batches_count_real_tokens():
    batch = lmdata.Collate(9, packed=False)([([1, 2, 3], [-100, 2, 3]), ([4], [4])])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["labels"].tolist() == [[-100, 2, 3], [4, -100, -100]]
    assert batch["num_tokens"].item() == 4


def test_packed_examples_do_not_attend_to_each_other():
    """The second example's logits are the same packed behind another one as alone."""
    from paratrain.models.causal_lm.build import build_causal_lm

    torch.manual_seed(0)
    model = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32).eval()
    model.config.use_cache = (
        False  # as in training: transformers reads packing only without a cache
    )
    a, b = [256, 10, 11, 12, 13], [256, 20, 21, 22]
    ((ids, _, pos, _),) = lmdata.pack([(a, a), (b, b)], 9, pad_id=258)
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos])).logits[0]
        alone = model(input_ids=torch.tensor([b])).logits[0]
        joined = model(input_ids=torch.tensor([a + b])).logits[0]  # no resets: b sees a
    torch.testing.assert_close(packed[5:9], alone, atol=1e-5, rtol=1e-5)
    assert (joined[5:9] - alone).abs().max() > 1e-3


def test_float8_batches_are_padded_to_a_multiple_of_16():
    batch = lmdata.Collate(9, packed=False, multiple=16)([([1, 2, 3], [-100, 2, 3]), ([4], [4])])
    assert batch["input_ids"].shape == (2, 16) and batch["num_tokens"].item() == 4
    assert batch["labels"][:, 3:].eq(-100).all() and batch["attention_mask"].sum().item() == 4


def test_plain_text_paragraphs_cut_into_rows_nothing_dropped(tmp_path):
    from paratrain.data.text.tokenizer import load_tokenizer

    (tmp_path / "a.txt").write_text(
        "One short paragraph.\n\n\nA second, " + "longer " * 20 + "one."
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("Third.")
    docs = lmdata.text_documents("text", str(tmp_path))
    assert docs == ["One short paragraph.", "A second, " + "longer " * 20 + "one.", "Third."]
    tok = load_tokenizer(None)
    rows = lmdata.text_examples(docs, tok, 16)
    assert all(len(ids) <= 16 and ids == labels for ids, labels in rows)  # every token trained
    tokens = sum(len(tok(d, add_special_tokens=False)["input_ids"]) + 2 for d in docs)
    assert sum(len(ids) for ids, _ in rows) == tokens  # BOS + text + EOS of each, all kept


def test_python_docs_ship_with_python_and_bad_text_paths_are_one_line(tmp_path):
    docs = lmdata.text_documents("python-docs", None)
    assert len(docs) > 50 and sum(map(len, docs)) > 300_000  # real prose, no download
    with pytest.raises(DataError, match="no .txt file nor a folder holding any"):
        lmdata.text_documents("text", str(tmp_path / "missing.txt"))
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(DataError, match="cannot read .* as UTF-8"):
        lmdata.text_documents("text", str(tmp_path / "bad.txt"))


def test_a_tiny_llama_learns_the_python_docs(tmp_path):
    from conftest import TINY_LM, train

    from paratrain.config import load_config
    from paratrain.runplan import resolve

    settings = [s for s in TINY_LM if not s.startswith("data.source")]
    cfg = load_config(
        None,
        [
            *settings,
            "data.source=python-docs",
            "train.max_steps=30",
            "train.lr=0.01",
            "data.batch_size=8",
            "lora.enabled=false",
            "train.eval=true",
            f"output_dir={tmp_path}",
        ],
    )
    assert resolve(cfg).task == "causal_lm"  # task auto: the first that reads python-docs
    s = train(cfg)["summary"]
    assert s["val_loss"] < 4.5  # bytes: ln(256) = 5.5 at random; real text is learnable
    assert json.loads((tmp_path / "result.json").read_text())["data_real"] is True


def test_a_bad_jsonl_line_is_named_by_the_files_own_line_number(tmp_path):
    """issue 50: a bad line 37 was reported as `line 1 column 60`, an array on line 37 as a
    record missing its fields, and an empty file by a data.max_length message."""
    import re

    from paratrain.data.text.data import read_records

    good = json.dumps({"instruction": "a", "input": "", "output": "b"})
    cases = {
        "bad.jsonl": ([good] * 36 + ['{"instruction": "x", oops}'], "line 37: not JSON"),
        "array.jsonl": ([good] * 36 + ['["an", "array"]'], "line 37: an array, not a record"),
        "empty.jsonl": ([], "is empty (no records)"),
        "empty.json": (["  "], "is empty (no records)"),
    }
    for name, (lines, says) in cases.items():
        f = tmp_path / name
        f.write_text("\n".join(lines))
        with pytest.raises(DataError, match=re.escape(says)):
            read_records(str(f))
    ok = tmp_path / "ok.jsonl"
    ok.write_text(good + "\n\n" + good + "\n")
    assert len(read_records(str(ok))) == 2
