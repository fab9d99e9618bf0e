"""Every Python example in the docs runs: the blocks of a page execute in
order in one namespace. A block whose first line is ``# sketch`` shows code
that needs the reader's own pieces (a sim) and is run elsewhere by a test."""

import linecache
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
#: The docs' pages with examples, and the READMEs' (the repository's and each package's).
PAGES = sorted(p for p in DOCS.rglob("*.md") if "```python" in p.read_text()) + sorted(
    p for p in [ROOT / "README.md", *ROOT.glob("packages/*/README.md")] if "```python" in p.read_text())


def blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def test_the_docs_have_examples():
    assert {p.relative_to(ROOT).as_posix() for p in PAGES} >= {
        "docs/rl_triton/index.md", "docs/track_gen/courses.md", "docs/track_gen/invalid-envs.md",
        "docs/track_gen/rl-auto-reset.md", "docs/track_gen/curricula.md", "docs/track_gen/cuda-graphs.md",
        "docs/track_gen/troubleshooting.md", "docs/track_gen/lifetime.md", "docs/racing_env/rendering.md",
        "docs/ppo.md", "README.md", "packages/rl_triton/README.md", "packages/track_gen/README.md",
        "packages/racing_env/README.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_examples_run(page):
    namespace: dict = {}
    ran = 0
    for k, code in enumerate(blocks(page)):
        if code.startswith("# sketch"):
            continue
        # Each block gets its own source name, so that code reading its own
        # source (Warp kernels do) finds it.
        name = f"{page.relative_to(ROOT).as_posix()} (block {k})"
        linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
        exec(compile(code, name, "exec"), namespace)  # noqa: S102 - our own docs
        ran += 1
    assert ran > 0
