"""A file changed between the index build reading it and the watcher starting has no event coming: the
workspace runs one catch-up scan once the watcher is on, so the datastore holds the file's new text."""
from __future__ import annotations


from rest_lsp.service import indexing
from rest_lsp.service.config import ServerConfig
from rest_lsp.service.core import CompletionService
from rest_lsp.service.workspace import WorkspaceIndex


class _DeafWatcher:
    """A watcher that hears nothing: only the catch-up scan can see the edit."""

    def stop(self) -> None:
        pass


def test_an_edit_made_before_the_watcher_started_is_indexed(tmp_path, tiny_model, monkeypatch):
    root = tmp_path / "ws"
    root.mkdir()
    target = root / "shapes.py"
    target.write_text("def area(w, h):\n    return w * h\n")
    build = indexing.open_or_build

    def build_then_edit(*a, **kw):
        out = build(*a, **kw)
        # saved after the build read the folder, before the watcher is on
        target.write_text("def perimeter_of_rectangle(width, height):\n    return 2 * (width + height)\n")
        return out

    monkeypatch.setattr(indexing, "open_or_build", build_then_edit)
    monkeypatch.setattr(indexing, "watch", lambda ds, on_update: _DeafWatcher())
    service = CompletionService(ServerConfig(model=str(tiny_model), cache_dir=str(tmp_path / "cache"),
                                             persist_history=False), notify=lambda level, msg: None)
    service.start()
    index = WorkspaceIndex(service, lambda level, msg: None)
    try:
        index.start([str(root)])
        assert index.wait_idle(timeout=120)
        folder = next(iter(index.folders.values()))
        assert folder.state == "ready", folder.error
        store = service.repository.get(folder.key)
        new_ids = service.worker.backend.encode("    return 2 * (width + height)")
        assert store.search(new_ids, n_max=len(new_ids), n_min=len(new_ids), max_len=1).match_len == len(new_ids)
        old_ids = service.worker.backend.encode("def area(w, h):\n    return w * h")
        assert store.search(old_ids, n_max=len(old_ids), n_min=len(old_ids), max_len=1).match_len == 0  # old text gone
        assert folder.updates == 1
    finally:
        index.close()
        service.close()
