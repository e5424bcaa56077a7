"""The documentation's relative links resolve, and the README stays a front door.

Reads README.md, docs/**/*.md and benchmarks/README.md (no processes spawned). Every relative
link, `[text](path)`, `[text](path#anchor)`, `[text](#anchor)` or a reference definition
`[label]: path`, must name an existing file or folder; an anchor into a Markdown file must name
one of its headings, slugged as GitHub does. Links inside code (fenced blocks, `spans`) are not
links and are skipped, as are URLs with a scheme (https:, mailto:).
"""
import glob
import os
import re
import unicodedata
from urllib.parse import unquote

import pytest

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 250

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(].*?[\"')])?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*?(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def doc_files():
    files = [os.path.join(REPO, "README.md"), os.path.join(REPO, "benchmarks", "README.md")]
    files += sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
    return [f for f in files if os.path.isfile(f)]


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip()[len(m.group(1)):].strip():
            fence = None


def strip_code_spans(line):
    return re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)


def links(path):
    """(line number, target) of every link in a Markdown file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for number, line in prose_lines(text):
        line = strip_code_spans(line)
        m = REFERENCE_DEF.match(line)
        if m:
            out.append((number, m.group(1)))
            continue
        out += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
    return out


def github_slug(heading):
    """The anchor GitHub gives a heading: its text (no markup) in lower case, punctuation
    dropped except '-' and '_', spaces turned into '-'."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)                                            # inline HTML
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        if ch in "-_ " or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            kept.append("-" if ch == " " else ch)
    return "".join(kept)


def anchors(path):
    """Every anchor a Markdown file defines: heading slugs (repeats get -1, -2, ...) and
    explicit <a name=...>/id=... anchors."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen, found = {}, set()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            slug = github_slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
        found.update(a for a in HTML_ANCHOR.findall(line))
    return found


def broken_links(path):
    problems = []
    for number, target in links(path):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part.split("?", 1)[0])
        if file_part.startswith("/"):
            dest = os.path.join(REPO, file_part.lstrip("/"))
        elif file_part:
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        else:
            dest = path
        where = f"{os.path.relpath(path, REPO)}:{number}: ({target})"
        if not os.path.exists(dest):
            problems.append(f"{where} names {os.path.relpath(dest, REPO)}, which does not exist")
        elif anchor and dest.endswith(".md") and os.path.isfile(dest):
            if unquote(anchor).lower() not in anchors(dest):
                problems.append(f"{where}: {os.path.relpath(dest, REPO)} has no heading '#{anchor}'")
    return problems


def test_github_slug():
    assert github_slug("Failure semantics and security") == "failure-semantics-and-security"
    assert github_slug("DDP steps on emulated 1 Gbit/s hosts") == "ddp-steps-on-emulated-1-gbits-hosts"
    assert github_slug("Surviving a lost rank: `dist.shrink_group`") == "surviving-a-lost-rank-distshrink_group"
    assert github_slug("Against Open MPI, with torch's own floor (same host, N=2)") == \
        "against-open-mpi-with-torchs-own-floor-same-host-n2"
    assert github_slug("[C++ API](cpp.md) pitfalls") == "c-api-pitfalls"


def test_link_parsing(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Title\n\nSee [a](other.md#x) and ![img](p.png 'caption').\n"
                    "Not a link: `[b](code.md)`.\n\n```\n[c](fenced.md)\n```\n\n[ref]: ref.md\n")
    assert [t for _, t in links(str(page))] == ["other.md#x", "p.png", "ref.md"]
    assert anchors(str(page)) == {"title", "title-1"}


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: os.path.relpath(p, REPO))
def test_relative_links_resolve(path):
    problems = broken_links(path)
    assert not problems, "\n".join(problems)


def test_readme_is_a_front_door():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail into docs/")
