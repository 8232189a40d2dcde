"""The team server (issue 33): REST drafts inside vLLM's serving engine, one model for many editors.

    config.py    the team configuration file the command writes and vLLM's worker reads (no torch, no vllm)
    proposer.py  RestProposer: vLLM's external speculative proposer (`method: custom_class`), REST's drafter
                 over the team datastores, one chain per request per step (imported inside vLLM's worker)
    server.py    `rest-lsp team-server`: resolves the model and datastores, writes the configuration, starts
                 vLLM's OpenAI-compatible server in the team venv (scripts/team_venv.sh) behind an API key
The editor side lives in the service: rest_lsp/service/team_client.py (a streaming /v1/completions client,
stdlib only) and rest_lsp/service/remote.py (RemoteBackend: the daemon's backend under the `server` setting).

docs/team.md describes the whole path.
"""
