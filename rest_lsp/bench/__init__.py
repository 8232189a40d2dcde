"""`rest-lsp bench` (ar, pld, rest-paper, rest on one model) and `rest-lsp replay` (offline draft-policy
evaluation against recorded greedy outputs). Entry points: `rest_lsp.bench.cli.bench_main` and `replay_main`."""
