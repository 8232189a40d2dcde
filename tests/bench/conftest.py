import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from testmodels.tiny import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("bench-tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_lm(tiny_dir):
    from rest_lsp.model.host import load_model

    return load_model(tiny_dir, device="cpu", precision="fp32")


@pytest.fixture(scope="session")
def corpus_dir(tiny_dir, tmp_path_factory):
    """A small corpus datastore (the standard library's json package) in the tiny model's tokenizer."""
    from indexer.store import Datastore

    src = Path(json.__file__).parent
    out = tmp_path_factory.mktemp("bench-ds") / "corpus"
    Datastore.build([src], out, tokenizer=str(tiny_dir)).close()
    return out


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory):
    rows = [
        {"id": "dumps", "prompt": "import json\n\n\ndef dumps(obj):\n    \"\"\"Serialize obj.\"\"\"\n"
                                   "    return json.dumps(obj, indent=2)\n\n\ndef loads(s):\n"},
        {"id": "fim", "prompt": "class Decoder:\n    def __init__(self, strict=True):\n        self.strict = ",
         "suffix": "\n\ndecoder = Decoder()\n"},
        {"id": "scan", "prompt": "def py_scanstring(s, end, strict=True):\n    chunks = []\n    _append = "},
    ]
    p = tmp_path_factory.mktemp("bench-prompts") / "prompts.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture(scope="session")
def tiny_codellama_dir(tmp_path_factory):
    from testmodels.tiny import make_tiny_codellama_dir

    return make_tiny_codellama_dir(tmp_path_factory.mktemp("bench-codellama") / "model", seed=0)
