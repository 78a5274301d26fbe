"""The version of the data plans: which rows a pretraining step reads, for a given config.

A checkpoint records `PLAN_VERSION` (bertjax/training/resume.py); a run resumed from one saved
with another version refuses in one line (`check`), since its remaining steps would read other
rows than the run it continues (no error would show it: the loss just moves). Bump
`PLAN_VERSION` in the commit that changes what a step of an existing config reads: a plan's
order, windows or packing, how documents are split or numbered, which documents are held out,
the rows of a store's pieces. Adding a plan or a config key whose default keeps the old rows
is no bump.

    1  the first recorded (issue 68); checkpoints saved before record none (0): issue 61's
       epoch order of token_windows rows came without a record, so those are not trusted
    2  documents numbered by their text, held-out never empty (hub-corpora); lanes of 256 rows
       and token_windows pieces of at most a quarter of the median shard (data start-up); NSP
       on a store or piece of one document draws its random B from that document
"""

from __future__ import annotations

PLAN_VERSION = 2  # the one number to bump
UNRECORDED = 0  # what a checkpoint saved before versions were recorded stands for
KEY = "data_plan_version"  # its name in a checkpoint's meta


def check(meta: dict, version: int, allow_change: bool, directory: str) -> None:
    """Refuses (ValueError, one line) a resume from a checkpoint whose ``meta`` records another
    data plan version than ``version``, unless ``allow_change`` (config.data.allow_plan_change)."""
    saved = int(meta.get(KEY, UNRECORDED))
    if saved == version or allow_change:
        return
    what = "none recorded: saved before bertjax kept it" if saved == UNRECORDED else saved
    raise ValueError(
        f"checkpoint in {directory} was saved with data plan version {what}, this bertjax plans "
        f"version {version}: the steps still to train would read other rows than the run it "
        "continues. Continue on purpose with --config.data.allow_plan_change=True (the steps "
        "from here read version "
        f"{version}'s rows), or start a new --workdir (bertjax/data/plan_version.py)"
    )
