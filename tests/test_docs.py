"""The code in README.md and docs/*.md is true: every ```python block runs, every ```bash block names
console scripts, flags, modules, files and extras that exist.

A page's python blocks run in order in one namespace, in a temporary working directory. A block that cannot
run here says so in an HTML comment on the line before it:

- ``<!-- not run: REASON -->``: never run (it needs a server, a data set, a download); the reason is required;
- ``<!-- needs: MODULE -->``: run where MODULE imports (``tensorflow``), else skipped and counted;
- ``<!-- run by: tests/FILE.py -->``: run, as written, by a test of FILE that has what it needs (a running
  server); FILE must name the page.

Every fenced block names its language, one of ``LANGUAGES``, so no python block escapes as ``py`` or as
an unnamed block. The blocks are cheap on a CPU: CIFAR ResNet-20 or smaller, a few images.
"""

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import os
import pathlib
import re
import shlex

import pytest

from keras_preact.models import registry

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

pytestmark = [pytest.mark.notf, pytest.mark.any_backend, pytest.mark.docs]

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))
LANGUAGES = {"python", "bash", "text"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
FENCE = re.compile(r"^```(\S*)[^\n]*$")
MARKER = re.compile(r"^<!-- (not run|needs|run by): (.*?) -->$")
# Each console script's (and ``python -m`` module's) argparse parser, to check the flags a block gives it.
PARSERS = {
    "keras-preact-train": ("keras_preact_training.cli", "build_parser"),
    "keras-preact-export": ("keras_preact_training.export", "build_parser"),
    "keras-preact-evaluate": ("keras_preact_training.evaluate", "build_parser"),
    "keras-preact-serve": ("keras_preact_serving.server", "build_parser"),
    "keras-preact-serve-ray": ("keras_preact_serving.ray_serve", "build_parser"),
    "keras_preact_training.reproduce": ("keras_preact_training.reproduce", "build_parser"),
    "keras_preact_training.publish": ("keras_preact_training.publish", "build_parser"),
}


@dataclasses.dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str = ""  # "not run", "needs" or "run by"
    reason: str = ""

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def blocks(page):
    """The fenced blocks of ``page``, with the marker comment on the line before each."""
    lines = (REPO / page).read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), None)
        assert end is not None, f"{page}:{index + 1}: a fenced block is not closed"
        marker = MARKER.match(lines[index - 1].strip()) if index else None
        found.append(Block(page, index + 1, opening.group(1), "\n".join(lines[index + 1:end]) + "\n",
                           *(marker.groups() if marker else ())))
        index = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def test_every_block_names_a_known_language_and_every_marker_a_reason():
    assert PAGES[0] == "README.md" and len(PAGES) > 1, PAGES
    for block in ALL_BLOCKS:
        assert block.language in LANGUAGES, f"{block.where}: ```{block.language} (allowed: {sorted(LANGUAGES)})"
        if block.marker:
            assert block.language == "python", f"{block.where}: only python blocks are run, so only they are marked"
            assert block.reason.strip(), f"{block.where}: <!-- {block.marker}: --> needs a reason"
        if block.marker == "needs":
            assert re.fullmatch(r"[a-z_][a-z0-9_.]*", block.reason), f"{block.where}: <!-- needs: MODULE -->"
        if block.marker == "run by":
            runner = REPO / block.reason
            assert re.fullmatch(r"tests/(\w+/)?test_\w+\.py", block.reason) and runner.is_file(), \
                f"{block.where}: <!-- run by: tests/test_FILE.py --> names no test file"
            assert f'"{block.page}"' in runner.read_text(), f"{block.where}: {block.reason} does not name {block.page}"


def available(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def python_blocks_count():
    """(run here or by another test, needs a module missing here, never run) over every page."""
    python = [b for b in ALL_BLOCKS if b.language == "python"]
    never = [b for b in python if b.marker == "not run"]
    missing = [b for b in python if b.marker == "needs" and not available(b.reason)]
    return len(python) - len(never) - len(missing), len(missing), len(never)


def test_most_python_blocks_run(capsys):
    """The count of python blocks run here, skipped for a missing module, and marked never to run."""
    run, missing, never = python_blocks_count()
    with capsys.disabled():
        print(f"\n[docs] python blocks: {run} run here, {missing} need a module missing here, {never} marked not run")
    assert run >= 10 and never <= 3, (run, missing, never)


@contextlib.contextmanager
def working_directory(path):
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.language == "python" for b in blocks(p))])
def test_python_blocks_run(page, tmp_path):
    """The page's python blocks in order, in one namespace, in an empty working directory."""
    namespace = {"__name__": f"docs_{re.sub(r'[^0-9a-zA-Z]', '_', page)}"}
    ran = 0
    registered = set(registry.list_models())
    with working_directory(tmp_path), contextlib.ExitStack() as cleanup:
        # A page may register networks: they leave the registry with it.
        cleanup.callback(lambda: [registry.unregister_model(n) for n in set(registry.list_models()) - registered])
        for block in blocks(page):
            if block.language != "python" or block.marker in ("not run", "run by"):
                continue
            if block.marker == "needs" and not available(block.reason):
                continue
            try:
                exec(compile(block.code, block.where, "exec"), namespace)  # the documentation's own code
            except Exception as error:
                raise AssertionError(f"{block.where}: the block fails: {type(error).__name__}: {error}") from error
            ran += 1
    if ran == 0:
        pytest.skip(f"{page}: every python block needs a module missing here")


def commands(code):
    """Each command of a bash block as its words: continued lines joined, comments and prompts dropped,
    ``A && B`` and ``A | B`` split, leading ``NAME=value`` assignments dropped."""
    joined = re.sub(r"\\\n", " ", code)
    for line in joined.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError as error:
            raise AssertionError(f"cannot split {line!r}: {error}") from error
        command = []
        for word in words + ["&&"]:
            if word in ("&&", "||", "|", ";"):
                while command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[0]):
                    command.pop(0)
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def program(words):
    """``keras-preact-*`` or the module of ``python -m MODULE``; the script of ``python path.py``."""
    if words[0].startswith("keras-preact"):
        return words[0], words[1:]
    if re.fullmatch(r"(\S*/)?python3?", words[0]) and len(words) > 1:
        if words[1] == "-m" and len(words) > 2 and words[2] not in ("pytest", "pip", "mkdocs", "ruff"):
            return words[2], words[3:]
        if words[1].endswith(".py"):
            return words[1], words[2:]
    return None, words


@functools.cache
def parser_options(name):
    """The option strings ``name``'s parser accepts (from its help), or None where its module is missing."""
    module_name, function = PARSERS[name]
    if not available(module_name.split(".")[0]):
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:  # an extra it needs (ray, ...) is not installed here
        return None
    return set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", getattr(module, function)().format_help()))


def extras_named(text):
    """The extras of every ``keras-preact[...]`` or ``".[...]"`` in ``text``."""
    for group in re.findall(r"(?:keras-preact|\.)\[([a-z0-9,-]+)\]", text):
        yield from group.split(",")


def test_bash_blocks_name_real_scripts_modules_files_and_flags():
    checked = 0
    for block in (b for b in ALL_BLOCKS if b.language == "bash"):
        for words in commands(block.code):
            name, arguments = program(words)
            if name is None:
                continue
            if name.startswith("keras-preact"):
                assert name in SCRIPTS, f"{block.where}: {name} is not a console script of pyproject.toml"
            elif name.endswith(".py"):
                assert (REPO / name).is_file(), f"{block.where}: {name} does not exist"
            else:
                spec = importlib.util.find_spec(name) if available(name.split(".")[0]) else None
                assert spec is not None and spec.origin.endswith(".py"), (
                    f"{block.where}: python -m {name}: no such module"
                )
            options = parser_options(name) if name in PARSERS else None
            for flag in (a.split("=")[0] for a in arguments if re.match(r"--?[A-Za-z]", a)):
                assert options is None or flag in options, f"{block.where}: {name} has no option {flag}"
            checked += 1
    assert checked >= 20, checked


def test_every_extra_named_exists():
    """``pip install "keras-preact[x]"`` / ``".[x]"`` anywhere on the pages names extras of pyproject.toml."""
    for page in PAGES:
        for extra in extras_named((REPO / page).read_text()):
            assert extra in EXTRAS, f"{page}: no extra [{extra}] in pyproject.toml (extras: {sorted(EXTRAS)})"


def slug(heading):
    """A heading's anchor, as GitHub and mkdocs' toc make it."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", text)


def test_readme_links_reach_files_and_headings():
    """The README's relative links (into docs/, REPRODUCTION.md, ...) name files that exist and headings they have;
    mkdocs --strict checks the links between the docs/ pages."""
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len(links) >= 10, links
    for target, anchor in links:
        if re.match(r"[a-z]+://", target):
            continue
        path = REPO / target
        assert path.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"README.md links to {target}#{anchor}: no such heading"


def test_install_docs_say_how_to_get_the_cpu_torch_build():
    """PyPI's Linux torch wheel pulls the nvidia-* packages even on a CPU machine: the install docs give
    PyTorch's CPU index, with the pin the extras hold."""
    command = 'pip install "torch<2.14" --index-url https://download.pytorch.org/whl/cpu'
    for page in ("README.md", "docs/index.md"):
        text = " ".join((REPO / page).read_text(encoding="utf-8").split())
        assert command in text and "nvidia-*" in text, page


def test_readme_python_blocks_each_stand_alone():
    """A reader copies one block: every name a README python block uses is imported or defined in it (a
    block that used ``np`` from the block before failed with NameError on its own)."""
    import ast
    import builtins

    for block in (b for b in blocks("README.md") if b.language == "python"):
        tree = ast.parse(block.code)
        defined = set(dir(builtins))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert not used - defined, f"{block.where}: uses {sorted(used - defined)} without defining them"


def run_serving_client(reason, present, replacements, tmp_path):
    """Run the docs/export-and-serving.md block marked "run by" ``reason`` (asserting each of ``present`` in its
    code, then applying ``replacements``) in ``tmp_path`` beside the ``cat.jpg`` it sends; (its printed output,
    the JPEG's bytes)."""
    import io

    from support import encode_image, photo_like

    [block] = [b for b in blocks("docs/export-and-serving.md") if b.marker == "run by" and b.reason == reason]
    assert all(text in block.code for text in present), block.code
    code = block.code
    for old, new in replacements.items():
        code = code.replace(old, new)
    jpeg = encode_image(photo_like(32, 32))
    (tmp_path / "cat.jpg").write_bytes(jpeg)
    printed = io.StringIO()
    with working_directory(tmp_path), contextlib.redirect_stdout(printed):
        exec(compile(code, block.where, "exec"), {"__name__": "docs_grpc_client"})  # the documentation's own code
    return printed.getvalue(), jpeg
