#!/usr/bin/env python3
"""Splits the contract, written as one file, into the reference's pages.

    python3 docs/reference/split.py MONOLITH

MONOLITH is the contract as one Markdown file (docs/interface.md as it was until issue
47: a preamble, then `## N. Title` sections). Each section becomes
docs/reference/<slug>.md (the slugs below; a new section gets one from its title), and
docs/interface.md becomes the index: the preamble, then a table of the pages. Links
are rewritten for the pages' folder: `(CHANGES.md)` becomes `(../CHANGES.md)`, an
anchor of another section `(#x)` becomes `(page.md#x)`.

Re-applying a later change of the one-file contract (a branch that still edits
docs/interface.md as one file): merge that change into the one-file version the pages
were last split from, then split again. That version is the tag `interface-one-file`
(move it to a commit holding the new one-file text after each re-split):

    git show BRANCH:docs/interface.md > /tmp/theirs.md
    git show "$(git merge-base interface-one-file BRANCH)":docs/interface.md > /tmp/base.md
    git show interface-one-file:docs/interface.md > /tmp/ours.md
    git merge-file -p /tmp/ours.md /tmp/base.md /tmp/theirs.md > /tmp/interface.md
    python3 docs/reference/split.py /tmp/interface.md     # the pages and the index
    git checkout HEAD -- docs/interface.md  # only if the merge left conflict markers there;
                                            # split.py has rewritten it as the index

Once nobody edits the one file any more, edit the pages themselves and forget the tag.
"""
import re
import sys
from pathlib import Path

SLUGS = {
    1: "overview",
    2: "exit-codes",
    3: "commands",
    4: "manifest",
    5: "lockset",
    6: "containers-and-leases",
    7: "run-record",
    8: "reports",
    9: "github-actions",
    10: "environment",
    11: "lock-directory",
    12: "history",
    13: "host-policy",
    14: "slurm",
}

SECTION = re.compile(r"^## (\d+)\. (.*)$")


def anchor(title):
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped,
    spaces made `-`."""
    t = title.strip().lower()
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


def slug(n, title):
    if n in SLUGS:
        return SLUGS[n]
    return re.sub(r"-+", "-", anchor(title.split(",")[0].split(":")[0])).strip("-")


def sections(text):
    """The preamble and each `## N.` section (outside code fences), in order."""
    pre, out, cur, fence = [], [], None, False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else SECTION.match(line.rstrip("\n"))
        if m:
            cur = [int(m.group(1)), m.group(2), [line]]
            out.append(cur)
        elif cur is None:
            pre.append(line)
        else:
            cur[2].append(line)
    return "".join(pre), out


def anchors_of(lines):
    found, fence = set(), False
    for line in lines:
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(anchor(line.lstrip("#")))
    return found


LINK = re.compile(r"\]\(([^)\s]+)\)")


def relink(body, own, where):
    def fix(m):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            return m.group(0)
        if target.startswith("#"):
            page = where.get(target[1:])
            if page and page != own:
                return f"]({page}.md{target})"
            return m.group(0)
        return f"](../{target})"
    return LINK.sub(fix, body)


def main():
    src = Path(sys.argv[1]).read_text()
    docs = Path(__file__).resolve().parent.parent
    pre, secs = sections(src)
    where = {}
    for n, title, lines in secs:
        s = slug(n, title)
        for a in anchors_of(lines):
            where.setdefault(a, s)
    rows = []
    for n, title, lines in secs:
        s = slug(n, title)
        first, rest = relink("".join(lines), s, where).split("\n", 1)
        page = (
            f"{first}\n\n*The reference, §{n}; the index of every section is "
            f"[docs/interface.md](../interface.md).*\n{rest}"
        )
        (docs / "reference" / f"{s}.md").write_text(page)
        rows.append(f"| {n} | [{title.strip()}](reference/{s}.md) |")
    intro = pre.split("\nThe sections keep their numbers", 1)[0].rstrip()
    intro = intro.replace(
        "This file is cibox's interface contract:",
        "cibox's interface contract is the reference in [`docs/reference/`](reference/), "
        "one page a section, indexed here:",
    )
    index = (
        intro
        + "\n\nThe sections keep their numbers, which code comments, tests and the guide cite"
        + " (`§6`, `section 6`); each is a page:\n\n| § | section |\n|---|---|\n"
        + "\n".join(rows)
        + "\n\nThe pages are split from the one-file contract by "
        + "[`docs/reference/split.py`](reference/split.py), which says how to re-apply a "
        + "change made to that one file. The guide ([`docs/guide/`](guide/README.md)) is "
        + "the user's view of it.\n"
    )
    (docs / "interface.md").write_text(index)


if __name__ == "__main__":
    main()
