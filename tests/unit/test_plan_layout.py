"""`paratrain plan --layout`: the one layout a user names, on any decoder shape (a shipped name
or a Llama-, Mistral- or Qwen-style config.json), priced by the analytic step; `--json` prints
one object. Pure: no GPU, no model allocated."""

import json

import pytest
from conftest import one_error_line

from paratrain.cli import main
from paratrain.errors import UserError
from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware, search
from paratrain.forecast.analytic.step import Cut, parse_cut

H100 = hardware.load("h100-sxm")

# Mistral 7B v0.1's and Qwen2.5 7B's config.json fields (their published files, trimmed to what
# a decoder's shape needs plus the keys that tell the family)
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


def test_a_layout_is_parsed_as_written():
    cut = parse_cut(
        "tp=8,pp=4,dp_replicate=2,async_tp,schedule=interleaved,stages_per_rank=2,microbatches=16",
        512,
    )
    assert cut == Cut(
        512,
        tp=8,
        pp=4,
        dp_replicate=2,
        async_tp=True,
        schedule="interleaved",
        stages_per_rank=2,
        microbatches=16,
    )
    assert cut.dp_shard == 8  # FSDP takes what TP, PP and the replicas leave: 512 / 32 / 2
    assert parse_cut("", 8) == Cut(8)  # FSDP over every GPU
    assert parse_cut("async_tp=false,tp=2", 8) == Cut(8, tp=2)


@pytest.mark.parametrize(
    "text, says",
    [
        ("tq=2", "unknown 'tq' (did you mean tp?)"),
        ("tp=two", "tp needs a whole number"),
        ("tp=2,tp=4", "tp given twice"),
        ("schedule=zero-bubble", "schedule='zero-bubble'"),
        ("pp=0", "pp must be >= 1"),
    ],
)
def test_a_layout_that_cannot_be_read_is_one_line(text, says):
    with pytest.raises(UserError, match="--layout: ") as e:
        parse_cut(text, 8)
    assert says in str(e.value)


def test_the_searched_best_priced_again_by_name_is_the_same_number(capsys):
    """The search and --layout price through one function: each scale's best layout, named
    back on the command line (Cut.as_flag), gives the search's tokens/s and memory."""
    seventy = shapes.shape("llama3.1-70b")
    for gpus in (16, 64, 512):  # 8 H100s do not hold 70B's training state
        b = search.best(seventy, H100, gpus)
        assert parse_cut(b["cut"].as_flag(), gpus) == b["cut"]
        flags = ["--gpus", str(gpus), "--layout", b["cut"].as_flag(), "--ac", b["ac"]]
        shape = ["--hardware", "h100-sxm", "--shape", "llama3.1-70b"]
        batch = ["--local-batch", str(b["local_batch"])]
        assert main(["plan", *shape, *flags, *batch, "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert found["layout"] == b["layout"]
        assert found["tps_per_gpu"] == pytest.approx(b["tps_per_gpu"])
        assert found["memory_gib"] == pytest.approx(b["memory_gib"])


def test_json_has_the_step_its_terms_and_memory(capsys):
    args = ["plan", "--hardware", "h100-sxm", "--shape", "llama3.1-70b", "--gpus", "64"]
    layout = ["--layout", "tp=8,pp=2,microbatches=4", "--local-batch", "4", "--ac", "full"]
    assert main([*args, *layout, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one object, one line
    found = json.loads(out)
    assert found["layout"] == "FSDP 4 x TP 8 x PP 2 1F1B, 4 micro-batches"
    assert found["global_batch"] == 16 and found["ac"] == "full"
    assert found["tps_per_gpu"] > 0 and found["memory_gib"] > 0 and found["fits"]
    # the step is its terms: each positive, summing to the step's seconds
    assert sum(found["terms"].values()) == pytest.approx(found["step_s"])
    assert found["tps_per_gpu"] == pytest.approx(16 * 8192 / 64 / found["step_s"])
    # what it takes for granted, said: the measured rates, an unfused loss, live tensors only
    assert any("h100-sxm-700w.rates.json" in a for a in found["assumes"])
    assert any("loss compiled over bf16 logits" in a for a in found["assumes"])
    assert not any("float8" in a for a in found["assumes"])
    assert main([*args, *layout, "--float8", "--json"]) == 0
    eight = json.loads(capsys.readouterr().out)
    assert any("float8 all-gather" in a for a in eight["assumes"])
    assert eight["tps_per_gpu"] > found["tps_per_gpu"]
    # the same without --json: the table's words
    assert main([*args, *layout]) == 0
    said = capsys.readouterr().out
    assert "tokens/s a GPU" in said and "fits" in said and "step terms (s): matmul" in said
    assert "  assumes: torch.compile over each layer" in said


@pytest.mark.parametrize("config", [MISTRAL_7B, QWEN25_7B], ids=["mistral", "qwen2"])
def test_a_config_json_of_another_llama_style_family_is_a_shape(tmp_path, capsys, config):
    folder = tmp_path / config["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    shape = shapes.shape(str(folder))  # the folder, or the file itself
    assert shape == shapes.shape(str(folder / "config.json"))
    assert (shape.hidden, shape.layers, shape.kv_heads) == (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_key_value_heads"],
    )
    args = ["plan", "--hardware", "h100-sxm", "--shape", str(folder), "--gpus", "8"]
    assert main([*args, "--layout", "tp=2", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["shape"] == config["model_type"] and found["layout"] == "FSDP 4 x TP 2"
    assert main(args) == 0  # the search takes it too
    assert "| 8 |" in capsys.readouterr().out


def test_what_the_plan_cannot_price_is_one_line(tmp_path, capsys):
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12}))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    base = ["plan", "--hardware", "h100-sxm", "--shape", "llama3.1-8b"]
    for args, says in (
        (["--gpus", "8", "--layout", "tp=3"], "8 GPUs do not split into TP 3"),
        (["--gpus", "8,64", "--layout", "tp=2"], "give one --gpus count"),
        (["--layout", "tp=2"], "give one --gpus count"),
        (["--gpus", "8", "--layout", "tp=2", "--global-batch", "8"], "give --local-batch"),
        (["--gpus", "8", "--ac", "full"], "--ac goes with --layout"),
        (["--gpus", "8", "--json"], "--json goes with --layout"),
        (["--gpus", "8", "--layout", "pp=2,microbatches=3", "--local-batch", "4"], "micro-batches"),
        (["--gpus", "8", "--layout", "tp=2", "--local-batch", "0"], "--local-batch: must be >= 1"),
    ):
        assert main([*base, *args]) == 2
        one_error_line(capsys, says)
    for path, says in ((gpt2, "Llama-style decoders only"), (broken, "is not JSON")):
        assert main(["plan", "--hardware", "h100-sxm", "--shape", str(path), "--gpus", "8"]) == 2
        one_error_line(capsys, says)
    missing = ["--shape", str(tmp_path / "none" / "config.json"), "--gpus", "8"]
    assert main(["plan", "--hardware", "h100-sxm", *missing]) == 2
    one_error_line(capsys, "cannot read")


def test_the_search_says_how_to_price_its_best_again(capsys):
    """Below the search's table, the flags that name its largest scale's best layout: run with
    them (and --json), they give the table's tokens/s."""
    shape = ["--hardware", "h100-sxm", "--shape", "llama3.1-8b"]
    assert main(["plan", *shape, "--gpus", "8,64"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "to price it again" in x)
    flags = line.split(": ", 1)[1].split(" (with")[0].split()
    assert flags[:2] == ["--gpus", "64"]
    row = next(x for x in out.splitlines() if x.startswith("| 64 |"))
    tps = float(row.split("|")[5].replace(",", ""))
    assert main(["plan", *shape, *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tps_per_gpu"] == pytest.approx(tps, abs=0.5)


def test_a_config_naming_its_own_head_width_is_priced_with_it():
    """Qwen3 names head_dim apart from hidden / heads (0.6B: 16 heads of 128 on a hidden of
    1,024): q and o are 2,048 wide, k and v 1,024, and the parameters come to its 0.6B."""
    qwen3 = dict(
        model_type="qwen3",
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    s = shapes.from_config("qwen3-0.6b", qwen3)
    assert (
        s.head_dim == 128 and s.linears()["q"] == (1024, 2048) and s.linears()["o"] == (2048, 1024)
    )
    assert s.linears()["k"] == (1024, 1024)
    assert 0.59e9 < s.params < 0.61e9
    without = shapes.from_config("llama-like", {**qwen3, "model_type": "llama", "head_dim": None})
    assert without.head_dim == 64 and without.linears()["q"] == (1024, 1024)


def test_the_search_names_its_training_flags_back(capsys):
    """An eager search with the compiled loss named: its hint says both, and gives its number."""
    shape = ["--hardware", "h100-sxm", "--shape", "llama3.1-8b"]
    extra = ["--eager", "--loss", "compiled", "--attention", "flash", "--seq-len", "4096"]
    assert main(["plan", *shape, "--gpus", "16", *extra]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "to price it again" in x)
    flags = line.split(": ", 1)[1].split(" (with")[0].split()
    for word in ("--eager", "compiled", "flash", "4096"):
        assert word in flags, (word, flags)
    row = next(x for x in out.splitlines() if x.startswith("| 16 |"))
    tps = float(row.split("|")[5].replace(",", ""))
    assert main(["plan", *shape, *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tps_per_gpu"] == pytest.approx(tps, abs=0.5)
    with pytest.raises(UserError, match="fsdp takes no value"):
        parse_cut("fsdp=2", 8)
