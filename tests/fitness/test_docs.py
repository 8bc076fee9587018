"""The README and docs/ as a reader follows them (issue 70, item 8): every relative link leads
to a file that is there, and to a heading that is there; the README's example of a spec's
problems is what launch prints for it. (The README's usage block is the parsers',
tests/fitness/test_usage_doc.py; its first command's output is what that command prints,
tests/console/test_next_steps.py.)"""

from __future__ import annotations

import collections
import os
import re
import shutil

from harness.helpers import REPO, launch

# [text](target), not an image's; targets with a scheme (https:, mailto:) are not relative
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
                               if f.endswith(".md"))


def anchors(path: str) -> set:
    """The anchors GitHub gives ``path``'s headings: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces made ``-``; a repeated one gets ``-1``, ``-2``, ..."""
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    seen: collections.Counter = collections.Counter()
    out = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = FENCE.sub("", f.read())  # a link-shaped text in a code block is not a link
        for target in LINK.findall(text):
            if re.match(r"[a-zA-Z][a-zA-Z+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(REPO, os.path.dirname(page), path)) if path \
                else os.path.join(REPO, page)
            if not os.path.exists(dest):
                broken.append(f"{page}: {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(f"{page}: {target}: no such heading in {os.path.relpath(dest, REPO)}")
    assert not broken, "\n".join(broken)


def test_the_anchors_are_githubs():
    assert {"keep-going-without-a-host-spares-shrinking-quarantine", "on-one-tpu-vm"} <= (
        anchors(os.path.join(REPO, "docs", "recovery.md")) | anchors(os.path.join(REPO, "docs", "tpu.md")))


def test_the_readmes_problems_example_is_what_launch_prints(tmp_path):
    """The README's ``jobs/my.yaml`` (jobs/linear.yaml with ``learning_rate: fast`` and
    ``num_stepz: 100``), launched as it says, prints its block to the letter."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    shown = re.search(r"```\n(error: jobs/my\.yaml:.*?)```\n", readme, re.S).group(1)
    (tmp_path / "jobs").mkdir()
    shutil.copy(os.path.join(REPO, "jobs", "linear.yaml"), tmp_path / "jobs" / "linear.yaml")
    text = (tmp_path / "jobs" / "linear.yaml").read_text()
    for old, new in (("  learning_rate: 0.1\n", "  learning_rate: fast\n"),
                     ("  num_steps: 100\n", "  num_stepz: 100\n")):
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "jobs" / "my.yaml").write_text(text)
    done = launch("jobs/my.yaml", cwd=str(tmp_path), timeout_s=60)
    assert done.returncode == 2 and not done.stdout, done.stdout + done.stderr
    assert done.stderr == shown, done.stderr
    assert not (tmp_path / "runs").exists()
