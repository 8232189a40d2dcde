"""`rest-lsp bench` with the tiny CodeLlama-layout model: a corpus built for it by `rest-index build
--tokenizer MODEL`, a --repo indexed in its tokenizer, FIM prompts; every engine method identical to ar."""
import json
from pathlib import Path

from rest_lsp.bench.cli import bench_main


def test_bench_with_codellama_corpus_and_repo(tiny_codellama_dir, tiny_dir, prompts_file, tmp_path, capsys):
    from indexer.cli import main as rest_index

    src = Path(json.__file__).parent
    assert rest_index(["build", str(src), "--out", str(tmp_path / "corpus"), "--tokenizer", str(tiny_codellama_dir),
                       "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"]["vocab_size"] == 32017
    out = tmp_path / "r.json"
    rc = bench_main(["--model", str(tiny_codellama_dir), "--prompts", str(prompts_file), "--limit", "2",
                     "--methods", "ar,rest-paper,rest", "--datastore", str(tmp_path / "corpus"), "--repo", str(src),
                     "--max-new-tokens", "24", "--json", str(out), "--no-warmup", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    r = json.loads(out.read_text())
    assert [p["id"] for p in r["methods"]["ar"]["per_prompt"]] == ["dumps", "fim"]   # "fim" has a suffix
    for name in ("rest-paper", "rest"):
        assert r["methods"][name]["identical_to_ar"] == 1.0, name
    assert r["methods"]["rest"]["tokens"] == r["methods"]["ar"]["tokens"] > 0
    # a corpus in another model's vocabulary is refused before any decoding, with the command that fixes it
    assert rest_index(["build", str(src), "--out", str(tmp_path / "qwen-corpus"), "--tokenizer", str(tiny_dir)]) == 0
    capsys.readouterr()
    rc = bench_main(["--model", str(tiny_codellama_dir), "--prompts", str(prompts_file), "--limit", "1",
                     "--methods", "ar,rest", "--datastore", str(tmp_path / "qwen-corpus"), "--no-warmup"])
    err = capsys.readouterr().err
    assert rc == 2 and "--tokenizer MODEL" in err and "Traceback" not in err
