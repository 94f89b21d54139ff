"""kernel_lock's declared boundary (issue 40): every module states its public names in ``__all__``,
and kernel_probe (and the benchmarks) import from kernel_lock only public modules and the names
their ``__all__`` lists.

Read with ``ast``, never imported: the check costs no torch and sees lazy imports inside functions
too. A name kernel_probe needs is made public where it is defined (added to that module's
``__all__``), never reached through a private module (``_x``), an underscore name, or a module that
merely imports it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "kernel_lock"
MODULES = sorted(p.relative_to(ROOT).as_posix() for p in LOCK.rglob("*.py"))
# kernel_probe, and the benchmarks that measure kernel_lock as its users import it (tests may reach
# inside)
PROBE = sorted(
    p.relative_to(ROOT).as_posix()
    for d in ("kernel_probe", "benchmarks")
    for p in (ROOT / d).rglob("*.py")
)


def _file(module: str) -> Path | None:
    """The source of a dotted kernel_lock module (a file, or a package's ``__init__``), or None."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def declared(module: str) -> tuple[str, ...] | None:
    """The names ``module``'s ``__all__`` lists (a literal list or tuple of strings), or None."""
    path = _file(module)
    assert path is not None, module
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value), (
                module
            )
            return tuple(value)
    return None


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _module_problem(module: str) -> str | None:
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        if _private(parts[i - 1]):
            return f"{module} is a private module of kernel_lock"
        if _file(".".join(parts[:i])) is None:
            return f"{module} is not a module of kernel_lock"
    if declared(module) is None:
        return f"{module} declares no __all__"
    return None


def _name_problem(module: str, name: str) -> str | None:
    """None where ``module.name`` is public: listed in its ``__all__``, or a public submodule."""
    if name in (declared(module) or ()):
        return None
    sub = f"{module}.{name}"
    if not _private(name) and _file(sub) is not None:
        return _module_problem(sub)
    return f"{name} is not in {module}.__all__"


def violations(source: str, where: str = "<source>") -> list[str]:
    """Every import of kernel_lock in ``source`` that reaches past its public names, as
    ``where:line: problem``. Covers ``from kernel_lock.x import y``, ``import kernel_lock.x``, and
    attributes read off a kernel_lock module bound to a name (``kernel_lock.x.y``, ``alias.y``)."""
    tree = ast.parse(source)
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> the kernel_lock module it is

    def problem(line: int, text: str | None) -> None:
        if text:
            found.append(f"{where}:{line}: {text}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "kernel_lock":
                continue
            trouble = _module_problem(node.module)
            problem(node.lineno, trouble)
            if trouble:
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                problem(node.lineno, _name_problem(node.module, alias.name))
                if _file(f"{node.module}.{alias.name}") is not None:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "kernel_lock":
                    continue
                problem(node.lineno, _module_problem(alias.name))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound["kernel_lock"] = "kernel_lock"
    for node in ast.walk(tree):
        # a chain's prefixes are checked too: harmless, the same names
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        inner: ast.expr = node
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if not (isinstance(inner, ast.Name) and inner.id in bound):
            continue
        module = bound[inner.id]
        # descend through submodules, then the first name must be public
        for attr in reversed(chain):
            if _file(f"{module}.{attr}") is not None and not _private(attr):
                module = f"{module}.{attr}"
                continue
            problem(node.lineno, _name_problem(module, attr))
            break
    return sorted(set(found))


# ---- every kernel_lock module declares its public names ------------------------------------------


@pytest.mark.parametrize("rel", MODULES)
def test_every_kernel_lock_module_declares_its_public_names(rel):
    path = ROOT / rel
    module = ".".join(Path(rel).with_suffix("").parts).removesuffix(".__init__")
    names = declared(module)
    if names is None and _private(path.stem):
        return  # a private module (``_x.py``) is kernel_lock's own: no public names to declare
    assert names is not None, f"{rel}: declare the public names in __all__"
    assert len(names) == len(set(names)), f"{rel}: a name listed twice in __all__"
    tree = ast.parse(path.read_text())
    bound = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    submodules = {p.stem for p in path.parent.glob("*.py")} | {
        p.name for p in path.parent.iterdir() if p.is_dir()
    }
    missing = [
        n for n in names if n not in bound and not (path.name == "__init__.py" and n in submodules)
    ]
    assert not missing, f"{rel}: __all__ lists names the module does not define: {missing}"
    assert not [n for n in names if _private(n)], f"{rel}: __all__ lists a private name"


# ---- kernel_probe imports only kernel_lock's public names ----------------------------------------


def test_kernel_probe_imports_only_kernel_locks_public_names():
    found = [v for rel in PROBE for v in violations((ROOT / rel).read_text(), rel)]
    assert not found, (
        "make the name public where it is defined (its module's __all__):\n" + "\n".join(found)
    )


def test_the_check_reads_every_kernel_probe_module_and_their_many_imports():
    count = sum(
        1
        for rel in PROBE
        for node in ast.walk(ast.parse((ROOT / rel).read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernel_lock")
    )
    # a sanity bound against an empty glob (issue 51 merged many modules: 138 files became ~100)
    assert len(PROBE) > 50 and count > 100, (len(PROBE), count)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("from kernel_lock._files import write_file", "kernel_lock._files is a private module"),
        ("from kernel_lock._toml import dumps", "kernel_lock._toml is a private module"),
        (
            "from kernel_lock.files import _write_all",
            "_write_all is not in kernel_lock.files.__all__",
        ),
        (
            "from kernel_lock.schema import _kwargs",
            "_kwargs is not in kernel_lock.schema.__all__",
        ),
        # a name a module only imports is not its to give
        (
            "from kernel_lock.lock import LockDocument",
            "LockDocument is not in kernel_lock.lock.__all__",
        ),
        (
            "from kernel_lock.format.schema import Slot",
            "kernel_lock.format.schema is not a module of kernel_lock",
        ),
        (
            "def f():\n    from kernel_lock.resolve import _make",
            "_make is not in kernel_lock.resolve.__all__",
        ),
        ("import kernel_lock._toml", "kernel_lock._toml is a private module"),
        (
            "import kernel_lock\nkernel_lock.lock.LockDocument",
            "LockDocument is not in kernel_lock.lock.__all__",
        ),
        ("import kernel_lock\nkernel_lock._version", "_version is not in kernel_lock.__all__"),
        (
            "from kernel_lock.slots import linear as b\nb._APPLIED",
            "_APPLIED is not in kernel_lock.slots.linear.__all__",
        ),
        (
            "import kernel_lock.toml as t\nt._key('a')",
            "_key is not in kernel_lock.toml.__all__",
        ),
        ("from kernel_lock import _toml", "_toml is not in kernel_lock.__all__"),
    ],
)
def test_a_private_or_undeclared_import_is_found(source, problem):
    found = violations(source)
    assert any(problem in v for v in found), found


@pytest.mark.parametrize(
    "source",
    [
        "from kernel_lock import LockError, load",
        "from kernel_lock import toml\nfrom kernel_lock import slots",
        "from kernel_lock.files import write_file, private_dir",
        "from kernel_lock.trust import check_target, locate\nfrom kernel_lock import registry",
        "import kernel_lock.fingerprint\nkernel_lock.fingerprint.FIELDS",
        "import kernel_lock\nkernel_lock.schema.Slot; kernel_lock.load",
        "from kernel_lock.slots import linear as b\nb.apply",
        "import json\njson.loads",
    ],
)
def test_public_imports_pass(source):
    assert violations(source) == []


def test_a_violation_in_a_module_file_fails_the_check(tmp_path):
    """The check on a file, as it reads kernel_probe's: a module that reaches the safe writer's
    private helper is named with its line."""
    bad = tmp_path / "bad_module.py"
    bad.write_text('"""A module."""\n\nfrom kernel_lock.files import _write_all, write_file\n')
    assert violations(bad.read_text(), bad.name) == [
        "bad_module.py:3: _write_all is not in kernel_lock.files.__all__"
    ]
