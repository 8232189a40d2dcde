import json

import pytest

from rest_lsp.bench.cli import bench_main

def plain_greedy(lm, prefix: str, suffix: str | None, n: int) -> list[int]:
    """Independent greedy decoding: transformers' forward over the whole sequence at every token (no cache, no
    verifier, no generate), stopping at the model's stop ids, on the prompt the bench builds."""
    import torch

    ids = lm.build_prompt(prefix, suffix, max_new_tokens=n)
    out: list[int] = []
    with torch.no_grad():
        while len(out) < n:
            nxt = int(lm.model(torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt in set(lm.stop_ids):
                break
            out.append(nxt)
    return out


KEYS = {"tokens", "seconds", "prefill_seconds", "tokens_per_s", "speedup_vs_ar", "steps", "mean_accepted",
        "retrieval_ms_p50", "retrieval_ms_p99", "identical_to_ar", "per_prompt"}


def test_bench_humaneval_all_methods(tiny_dir, corpus_dir, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = bench_main(["--model", str(tiny_dir), "--prompts", "humaneval", "--limit", "2",
                     "--methods", "ar,pld,pld-hf,rest-paper,rest", "--datastore", str(corpus_dir),
                     "--max-new-tokens", "24", "--json", str(out), "--plot", str(png), "--device", "cpu"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert list(r["methods"]) == ["ar", "pld", "pld-hf", "rest-paper", "rest"]
    assert r["n_prompts"] == 2 and r["max_new_tokens"] == 24 and r["precision"] == "fp32"
    for name, m in r["methods"].items():
        assert KEYS <= set(m), name
        assert len(m["per_prompt"]) == 2
        assert [p["id"] for p in m["per_prompt"]] == ["HumanEval/0", "HumanEval/1"]
        assert m["tokens"] == sum(p["tokens"] for p in m["per_prompt"]) > 0
        assert m["prefill_seconds"] < m["seconds"]
        assert m["tokens_per_s"] > 0 and m["steps"] >= 2
    ar = r["methods"]["ar"]
    assert ar["speedup_vs_ar"] == pytest.approx(1.0) and ar["mean_accepted"] == pytest.approx(1.0)
    assert ar["retrieval_ms_p50"] is None
    # greedy speculative decoding is exact: every method emits the tokens of an independent plain greedy run
    # (pld on the engine's verifier and pld-hf, transformers' own, included), and so agrees with ar
    from rest_lsp.bench.prompts import load_prompts
    from rest_lsp.model.host import load_model

    lm = load_model(tiny_dir, device="cpu", precision="fp32")
    truth = [plain_greedy(lm, p.prefix, p.suffix, 24) for p in load_prompts("humaneval")[:2]]
    assert all(truth), truth
    for name, m in r["methods"].items():
        assert [p["output_ids"] for p in m["per_prompt"]] == truth, name
        assert m["identical_to_ar"] == 1.0, name
    assert [p["output_ids"] for p in r["methods"]["pld"]["per_prompt"]] == [p["output_ids"] for p in ar["per_prompt"]]
    for name in ("pld", "rest-paper", "rest"):
        m = r["methods"][name]
        assert m["retrieval_ms_p50"] is not None and m["retrieval_ms_p99"] >= m["retrieval_ms_p50"]
        # every decoding step's drafting time is kept (the first token comes from the prefill, not a draft)
        assert [len(p["retrieval_ms"]) for p in m["per_prompt"]] == [p["steps"] - 1 for p in m["per_prompt"]]
        assert m["mean_accepted"] >= 1.0
        # steps and tokens agree with M: each decoding step emits M tokens on average
        dec_tokens = m["tokens"] - 2
        assert m["mean_accepted"] == pytest.approx(dec_tokens / (m["steps"] - 2))
    assert r["methods"]["rest-paper"]["config"]["sources"] == {"paper": 1.0}
    # pld runs on the verifier and loop of ar and rest, drafting one prompt-lookup chain of 10 tokens per step;
    # pld-hf is transformers' generate on its eager forward
    pld, hf = r["methods"]["pld"], r["methods"]["pld-hf"]
    assert pld["config"]["verifier"] == ar["config"]["verifier"] == r["verifier"]
    assert pld["config"]["loop"] == ar["config"]["loop"] == "rest_lsp.engine.Engine"
    assert pld["config"]["policy"] == "pld" and pld["config"]["sources"] == {"lookup": 1.0}
    assert pld["config"]["draft_budget"] == pld["config"]["draft_len"] == 10
    assert pld["mean_draft_nodes"] <= 10
    assert hf["config"] == {"loop": "transformers generate", "verifier": "transformers", "forward": "eager",
                            "prompt_lookup_num_tokens": 10}
    assert hf["retrieval_ms_p50"] is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "rest-paper" in table and "tok/s" in table


def test_bench_jsonl_with_suffix_and_repo(tiny_dir, prompts_file, tmp_path):
    import json as json_mod
    from pathlib import Path

    out = tmp_path / "r.json"
    repo = Path(json_mod.__file__).parent
    rc = bench_main(["--model", str(tiny_dir), "--prompts", str(prompts_file), "--limit", "2",
                     "--methods", "rest,ar", "--repo", str(repo), "--rest-policy", "context=0.5,repository=0.5",
                     "--max-new-tokens", "16", "--json", str(out), "--no-warmup"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert list(r["methods"]) == ["rest", "ar"]
    assert r["methods"]["rest"]["config"]["sources"] == {"context": 0.5, "repository": 0.5}
    assert r["methods"]["rest"]["identical_to_ar"] == 1.0
    assert [p["id"] for p in r["methods"]["ar"]["per_prompt"]] == ["dumps", "fim"]


@pytest.mark.parametrize("argv,msg", [
    (["--prompts", "humaneval", "--methods", "ar,nope"], "unknown method"),
    (["--prompts", "humaneval", "--methods", "rest-paper"], "needs a corpus datastore"),
    (["--prompts", "/no/such/file.jsonl"], "does not exist"),
    (["--prompts", "humaneval", "--limit", "0"], "at least 1"),
    (["--prompts", "humaneval", "--offset", "164"], "outside the 164 prompts"),
    (["--prompts", "humaneval", "--methods", "ar,rest-history"], "needs a saved history"),
    (["--prompts", "humaneval", "--rest-policy", "context=1,bogus=2"], "unknown draft source"),
])
def test_bench_bad_arguments(argv, msg, capsys, monkeypatch):
    import rest_lsp.model.host as host

    monkeypatch.setattr(host, "load_model", lambda *a, **k: pytest.fail("should fail before loading a model"))
    assert bench_main(argv) == 2
    assert msg in capsys.readouterr().err


def test_bad_jsonl_rows(tmp_path):
    from rest_lsp.bench.prompts import PromptsError, load_prompts

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "x"}\n{"suffix": "y"}\n')
    with pytest.raises(PromptsError, match=":2:"):
        load_prompts(str(f))
    f.write_text('{"prompt": "x", "suffix": "y"}\n\n{"prompt": "z"}\n')
    rows = load_prompts(str(f))
    assert [(r.prefix, r.suffix) for r in rows] == [("x", "y"), ("z", None)]


def test_bench_verifier_kinds_give_identical_tokens(tiny_dir, prompts_file, tmp_path):
    """ar, pld and rest share the --verifier kind (recorded in the report); auto (the fast verifier on this
    Qwen2 tiny model where the CPU allows, else eager) emits exactly eager's tokens."""
    reports = {}
    for kind in ("eager", "auto"):
        out = tmp_path / f"{kind}.json"
        rc = bench_main(["--model", str(tiny_dir), "--prompts", str(prompts_file), "--methods", "ar,pld,rest",
                         "--max-new-tokens", "16", "--json", str(out), "--no-warmup", "--device", "cpu",
                         "--verifier", kind])
        assert rc == 0
        reports[kind] = json.loads(out.read_text())
    from rest_lsp.model.probes import cpu_has_bf16, packing_available

    eager, auto = reports["eager"], reports["auto"]
    # auto's rule (rest_lsp/model/verifiers.py make_verifier) for a Qwen2 model on this CPU
    want = ("screened" if cpu_has_bf16() else "packed") if packing_available() else "eager"
    assert eager["verifier"] == "eager" and auto["verifier"] == want
    for r in (eager, auto):
        assert {m["config"]["verifier"] for m in r["methods"].values()} == {r["verifier"]}
        assert r["methods"]["rest"]["identical_to_ar"] == r["methods"]["pld"]["identical_to_ar"] == 1.0
    from rest_lsp.bench.prompts import load_prompts
    from rest_lsp.model.host import load_model

    lm = load_model(tiny_dir, device="cpu", precision="fp32")
    truth = [plain_greedy(lm, p.prefix, p.suffix, 16) for p in load_prompts(str(prompts_file))]
    assert all(truth), truth
    for name in ("ar", "pld", "rest"):
        for r in (eager, auto):
            assert [p["output_ids"] for p in r["methods"][name]["per_prompt"]] == truth, (name, r["verifier"])


def test_verifier_choice_falls_back_only_for_auto(tiny_lm):
    """make_verifier_or_eager: auto falls back to eager where the fast verifier cannot run the model, an
    explicit kind fails instead; each kind gets its own c(q) cache key."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from rest_lsp.engine.cost import cost_key
    from rest_lsp.model.attention import tree_attention
    from rest_lsp.model.ops import UnsupportedModel
    from rest_lsp.model.probes import bf16_packing_available
    from rest_lsp.model.verifiers import make_verifier_or_eager, verifier_kind

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval()
    assert verifier_kind(make_verifier_or_eager(gpt2, "auto")) == "eager"
    with pytest.raises(UnsupportedModel, match="architecture"):
        make_verifier_or_eager(gpt2, "packed")
    with pytest.raises(ValueError, match="verifier kind"):
        make_verifier_or_eager(tiny_lm, "fastest")
    kinds = ("eager", "packed", "screened") if bf16_packing_available() else ("eager", "packed")
    if not bf16_packing_available():  # an AVX2-only CPU: the screened head is refused, not replaced
        with pytest.raises(UnsupportedModel, match="bf16"):
            make_verifier_or_eager(tiny_lm, "screened")
    keys = {k: cost_key("tiny", "fp32", "cpu", make_verifier_or_eager(tiny_lm, k)) for k in kinds}
    assert [verifier_kind(make_verifier_or_eager(tiny_lm, k)) for k in keys] == list(keys)
    assert len(set(keys.values())) == len(kinds)
    # float64 attention (where fp32 SDPA is not row-invariant) has its own c(q): a c(q) measured with fp32
    # attention underestimated tree rows on an AVX2-only CPU; and so has the compiled tree attention that replaces
    # float64 where it builds
    packed = make_verifier_or_eager(tiny_lm, "packed")
    kernel = tree_attention(torch.float32)
    packed.lm.attention_dtype, packed.lm.tree_attention = None, None
    fp32_key = cost_key("tiny", "fp32", "cpu", packed)
    packed.lm.attention_dtype = torch.float64
    assert cost_key("tiny", "fp32", "cpu", packed) == fp32_key.replace("packed", "packed-att64")
    if kernel is not None:
        packed.lm.tree_attention = kernel
        assert cost_key("tiny", "fp32", "cpu", packed) == fp32_key.replace("packed", "packed-attk")


def test_bench_history_saved_and_restored(tiny_dir, prompts_file, tmp_path, capsys):
    """--save-history keeps rest's output; a later run's rest-history starts from it (as a restarted daemon
    starts from its cache) and drafts the same prompt's output from it, side by side with a cold rest."""
    from rest_lsp.engine.history import load_history

    hist = tmp_path / "h.msgpack"
    base = ["--model", str(tiny_dir), "--prompts", str(prompts_file), "--max-new-tokens", "24",
            "--draft-budget", "8", "--no-warmup", "--device", "cpu"]
    first, both = tmp_path / "first.json", tmp_path / "both.json"
    assert bench_main(base + ["--methods", "rest", "--limit", "1", "--json", str(first),
                              "--save-history", str(hist)]) == 0
    out = json.loads(first.read_text())["methods"]["rest"]["per_prompt"][0]["output_ids"]
    saved = load_history(hist, "model").tolist()  # the output, and what the last step verified past the limit
    assert saved[: len(out)] == out and len(saved) <= len(out) + 9
    # default methods with --history: rest (cold) and rest-history side by side
    assert bench_main(base + ["--limit", "1", "--json", str(both), "--history", str(hist)]) == 0
    r = json.loads(both.read_text())
    assert list(r["methods"]) == ["ar", "pld", "pld-hf", "rest", "rest-history"] and r["history"] == str(hist)
    cold, warm = r["methods"]["rest"], r["methods"]["rest-history"]
    assert warm["per_prompt"][0]["output_ids"] == cold["per_prompt"][0]["output_ids"] == out
    assert warm["identical_to_ar"] == 1.0 and warm["mean_accepted"] > cold["mean_accepted"]
    offset = tmp_path / "offset.json"
    assert bench_main(base + ["--methods", "rest", "--offset", "1", "--limit", "1", "--json", str(offset)]) == 0
    assert [p["id"] for p in json.loads(offset.read_text())["methods"]["rest"]["per_prompt"]] == ["fim"]
    capsys.readouterr()
    assert bench_main(base + ["--history", str(tmp_path / "missing.msgpack")]) == 2
    assert "no history file" in capsys.readouterr().err
