"""The docs build runs the example of every framework page, in docs/_hooks.py:
NOTE [ Framework pages run their example in the docs build ].

Each page has one, a failing example is reported naming its page, exit status and error, and a
page without one is a failure too."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _hooks():
    spec = importlib.util.spec_from_file_location("loaderlib_docs_hooks_examples", ROOT / "docs" / "_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_framework_page_has_an_example_importing_its_integration():
    hooks = _hooks()
    pages = sorted((ROOT / "docs" / hooks.EXAMPLE_PAGES).glob("*.md"))
    assert {p.stem for p in pages} >= {"lightning", "accelerate", "hf-trainer", "dcp", "keras", "orbax"}
    for page in pages:
        code = hooks.page_example(page.read_text(encoding="utf-8"))
        assert "import loaderlib as ll" in code, page.name
        compile(code, page.name, "exec")   # one program, as the build runs it


def test_blocks_join_in_order_and_other_languages_are_left_out():
    hooks = _hooks()
    page = "# T\n\n```python\na = 1\n```\n\ntext\n\n```bash\nexit 1\n```\n\n```python\nb = a + 1\n```\n"
    assert hooks.page_example(page) == "a = 1\n\nb = a + 1"
    assert hooks.page_example("# no example\n") == ""


def test_a_failing_example_is_reported_with_its_status_and_error():
    hooks = _hooks()
    assert hooks.run_example("import os\nopen('here.txt', 'w').write('x')\n", "docs/ok.md") is None
    err = hooks.run_example("print('before')\nraise SystemExit('the example broke')\n", "docs/bad.md")
    assert err.startswith("it exited with status 1 in a new process (docs/bad.md)")
    assert "before" in err and "the example broke" in err
    assert hooks.run_example("", "docs/empty.md") == "it has no ```python example"
    assert hooks.run_example(f"import sys; sys.exit(0 if sys.executable == {sys.executable!r} else 3)", "x") is None


def test_the_build_names_each_page_that_failed():
    hooks = _hooks()
    runs = hooks._Examples()
    runs.start({"integrations/good.md": "```python\nx = 1\n```\n",
                "integrations/bad.md": "```python\nimport not_a_module_anywhere\n```\n",
                "integrations/none.md": "# nothing to run\n"})
    failed = runs.failures()
    assert len(failed) == 2
    assert failed[0].startswith("docs/integrations/bad.md: its example failed: it exited with status 1")
    assert "No module named 'not_a_module_anywhere'" in failed[0]
    assert failed[1] == "docs/integrations/none.md: its example failed: it has no ```python example"
    assert runs.runs == {} and runs.pool is None


def test_the_loader_guide_names_the_framework_versions_tested():
    """docs/guide/loader.md's table of frameworks names each version requirements-frameworks.txt pins."""
    guide = (ROOT / "docs" / "guide" / "loader.md").read_text(encoding="utf-8")
    table = guide[guide.index("## Inside training frameworks"):]
    table = table[:table.index("\n## ")] if "\n## " in table else table
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements-frameworks.txt").read_text().splitlines()]
    pins = [p for p in pins if "==" in p]
    assert len(pins) >= 6
    for pin in pins:
        name, version = pin.split("==")
        assert version in table, f"{name} {version} is not in the loader guide's table"
