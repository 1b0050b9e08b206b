"""A minimal attempt-safe task over the core journal, the pattern every Seedance task follows.

`replace_files` rewrites every `*.txt` of a directory into its upper-case version: recover the
earlier attempts' journals (its own prefix only), stop if one of them finished the work, else
stage, verify and commit under a journal id of its own.
"""

from __future__ import annotations

import secrets

from seedance_tasks import journal, lease, storage


def replace_files(root_uri: str, run_id: str, holder: str) -> dict:
    """Upper-case every data file under `root_uri/data/` once, whatever attempt gets there."""
    root = storage.resolve(root_uri)
    with lease.holding(root, "dataset", holder=holder, purpose="chaos test", ttl_s=60) as held:
        recovered = journal.recover(root, "chaos", prefix=f"{run_id}-")
        done = [item for item in journal_ids(root, run_id) if journal.find(root, item).state == journal.DONE]
        if done:
            return {"recovered": recovered, "done_by": done[0]}
        attempt = f"{run_id}-a{secrets.token_hex(3)}"
        sources = [root.relative(info.path) for info in storage.list_files(root.child("data"))]
        entry = journal.Journal.begin(root, attempt, "chaos", [], sources)
        for relative in sources:
            final = relative.removesuffix(".txt") + ".TXT"
            staged = storage.hidden_sibling(final, attempt)
            entry.add_publish(staged, final)
            text = storage.read_bytes(root.fs, root.join(relative)).decode()
            storage.write_bytes_atomic(root.fs, root.join(staged), text.upper().encode())
        held.check()
        entry.commit()
        return {"recovered": recovered, "done_by": attempt}


def journal_ids(root, run_id: str) -> list[str]:
    """Ids of the finished journals of `run_id`'s attempts."""
    done = root.child(journal.DONE_DIR)
    return sorted(
        info.path.rsplit("/", 1)[-1].removesuffix(".json")
        for info in storage.list_files(done, include_hidden=True)
        if info.path.rsplit("/", 1)[-1].startswith(f"{run_id}-")
    )


def save_checkpoint(store_uri: str, run: str, step: int) -> dict:
    """Save a small deterministic state as `run`/`step` (a trainer's save, as its own process)."""
    import torch

    from seedance_tasks import checkpoint

    state = {"w": torch.arange(20_000, dtype=torch.float32) / (step + 7), "step": step}
    return {"kind": checkpoint.save(state, store_uri, run, step)["kind"]}
