"""Words a user knows (issue 50, item 3): the project's history ("the seed") is out of what a
user reads, and the words the messages use are in a glossary the messages name."""

from __future__ import annotations

import glob
import os
import re

from harness.helpers import REPO

from launcher.words import GLOSSARY
from launcher.rundir import ledger

# what a user reads: the shipped jobs (their comments), the docs, the README, the examples;
# bench/ and tests/ may keep the project's own word
READ_BY_USERS = ("jobs/*.yaml", "jobs/clusters/*.yaml", "docs/*.md", "README.md", "examples/*.py")
TERMS = ("goodput", "badput", "attempt", "preflight", "local copy", "local tier",
         "own step time", "agreed step", "interrupt")


def test_the_seed_is_not_in_anything_a_user_reads():
    said = []
    for pattern in READ_BY_USERS:
        for path in sorted(glob.glob(os.path.join(REPO, pattern))):
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if re.search(r"\bthe seed\b(?!_| *:)", line, re.I):
                        said.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    assert not said, "\n".join(said)


def test_the_glossary_explains_every_word_the_messages_use_and_they_name_it():
    with open(os.path.join(REPO, GLOSSARY), encoding="utf-8") as f:
        text = f.read().lower()
    missing = [term for term in TERMS if f"**{term}" not in text and f", {term}**" not in text]
    assert not missing, missing
    run = {"goodput": 0.2, "wall_s": 3.5, "largest_badput": "compilation",
           "buckets_s": {"productive": 0.7, "compilation": 1.2}}
    line = ledger.summary_line(run)
    assert GLOSSARY in line and "training steps that count" in line and "paid once" in line, line
