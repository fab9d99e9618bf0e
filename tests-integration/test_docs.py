"""Every Python example in the docs runs: the blocks of a page execute in
order as one script, in a fresh process, and it exits. A block whose first line is ``# sketch`` shows code
that needs the reader's own pieces (a sim) and is run elsewhere by a test.

What an example prints is what its page says it prints: each ``print(...)``
line of a block that runs ends in a comment ``# prints TEXT``, and the run's
output holds one line matching each TEXT, in the order of the page (``...``
in TEXT stands for any text, as in doctest; lines the libraries print
between them are ignored)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
#: The docs' pages with examples, and the READMEs' (the repository's and each package's).
PAGES = sorted(p for p in DOCS.rglob("*.md") if "```python" in p.read_text()) + sorted(
    p for p in [ROOT / "README.md", *ROOT.glob("packages/*/README.md")] if "```python" in p.read_text())


def blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def stated_outputs(code: str) -> list[str | None]:
    """The TEXT of each print line's ``# prints TEXT`` comment (None where a
    print line has none)."""
    return [line.split("# prints ", 1)[1].strip() if "# prints " in line else None
            for line in code.splitlines() if re.match(r"\s*print\(", line)]


def matches(stated: str, line: str) -> bool:
    """Whether a printed line is the stated TEXT, ``...`` standing for any text."""
    pattern = ".*".join(re.escape(part) for part in stated.split("..."))
    return re.fullmatch(pattern, line.strip()) is not None


def unmatched(stated: list[str], printed: str) -> list[str]:
    """The stated lines not found, in order, among the printed lines."""
    lines = iter(printed.splitlines())
    return [text for text in stated if not any(matches(text, line) for line in lines)]


def test_stated_outputs_are_matched_in_order():
    assert stated_outputs("x = 1\nprint(x)  # prints 1\n    print(x, 2)   # prints 1 ...\nprint(3)\n") == [
        "1", "1 ...", None]
    assert unmatched(["0.0486", "41 10.0"], "Warp banner\n0.0486\nnoise\n41 10.0\n") == []
    assert unmatched(["41 10.0", "0.0486"], "0.0486\n41 10.0\n") == ["0.0486"]
    assert unmatched(["about 0.09"], "0.0486\n") == ["about 0.09"]
    assert unmatched(["8 [42, ...]"], "8 [42, 43, 45]\n") == []


def test_the_docs_have_examples():
    assert {p.relative_to(ROOT).as_posix() for p in PAGES} >= {
        "docs/rl_triton/index.md", "docs/track_gen/courses.md", "docs/track_gen/invalid-envs.md",
        "docs/track_gen/rl-auto-reset.md", "docs/track_gen/curricula.md", "docs/track_gen/cuda-graphs.md",
        "docs/track_gen/troubleshooting.md", "docs/track_gen/lifetime.md", "docs/racing_env/rendering.md",
        "docs/ppo.md", "README.md", "packages/rl_triton/README.md", "packages/track_gen/README.md",
        "packages/racing_env/README.md"}


#: The longest a page's examples may run, in seconds (the slowest, docs/ppo.md, takes about 20 s).
PAGE_SECONDS = 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_examples_run(page, tmp_path):
    """A page's blocks run in order as one script, in a fresh process, as a
    reader would run them: it exits 0 within `PAGE_SECONDS` (no hang at
    exit), with no traceback on stderr, printing what the page states."""
    code = [block for block in blocks(page) if not block.startswith("# sketch")]
    assert code
    script = tmp_path / "page.py"
    script.write_text("\n".join(code))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=PAGE_SECONDS,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "Traceback" not in run.stderr, run.stderr[-4000:]
    stated = [text for block in code for text in stated_outputs(block)]
    assert None not in stated, f"a print line without its '# prints TEXT' comment; printed:\n{run.stdout}"
    missing = unmatched(stated, run.stdout)
    assert not missing, f"stated but not printed: {missing}; printed:\n{run.stdout}"


def test_the_built_site_navigates_from_disk(tmp_path):
    """The README says to open site/index.html: opened from disk, a link to a
    folder shows a directory listing, so every page links to .html files."""
    import os
    from html.parser import HTMLParser

    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]

    class Links(HTMLParser):
        def __init__(self):
            super().__init__()
            self.hrefs = []

        def handle_starttag(self, tag, attrs):
            if tag == "a":
                self.hrefs += [v for k, v in attrs if k == "href" and v]

    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")  # a server's page, not the reader's
    for page in pages:
        links = Links()
        links.feed(page.read_text())
        local = [h.split("#")[0] for h in links.hrefs if not re.match(r"[a-z]+:", h) and not h.startswith("#")]
        folders = [h for h in local if h and (h.endswith("/") or h in (".", ".."))]
        assert not folders, f"{page.relative_to(site)} links to folders: {folders[:5]}"
        for href in local:
            if href.endswith(".html"):
                assert (page.parent / href).resolve().is_file(), f"{page.relative_to(site)}: {href}"
    assert (site / "index.html") in pages and (site / "racing_env" / "runner.html") in pages
