"""torch/version.py read as Python runs it, or not trusted (issue 24, point 2).

The accepted form is what torch's generator (tools/generate_torch_version.py) writes; the files
below are real ones from CPU, CUDA and ROCm builds (wheels and source builds, 2.2 to 2.13; the git
hashes are the releases' own). Everything else -- an annotation with a side effect, a name rebound
by an import alias, code -- makes every build field unsure, so the fingerprint falls back to torch
and ``--debug`` says why. A torch whose compiled parts are missing (``import torch`` fails) is never
read as current.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from kernel_lock import fingerprint, torchless

REAL = {
    # torch 2.2.1 CPU (PyPI macOS/aarch64 wheel: no local version)
    "2.2.1 cpu": (
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', "
        "'hip']\n__version__ = '2.2.1'\ndebug = False\ncuda: Optional[str] = None\ngit_version = "
        "'6c8c5ad5eaf47a62fafbb4a2747198cbffbf1ff0'\nhip: Optional[str] = None\n",
        ("2.2.1", "", ""),
    ),
    "2.2.2 cu121": (
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        "__version__ = '2.2.2+cu121'\ndebug = False\ncuda: Optional[str] = '12.1'\n"
        "git_version = '39901f229520a5256505ec24782f716ee7ddc843'\nhip: Optional[str] = None\n",
        ("2.2.2", "12.1", ""),
    ),
    "2.4.0 cu118": (
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        "__version__ = '2.4.0+cu118'\ndebug = False\ncuda: Optional[str] = '11.8'\n"
        "git_version = 'e4ee3be4063b7c430974252fdf7db42273388d86'\nhip: Optional[str] = None\n",
        ("2.4.0", "11.8", ""),
    ),
    "2.5.0 cu124": (
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        "__version__ = '2.5.0+cu124'\ndebug = False\ncuda: Optional[str] = '12.4'\n"
        "git_version = '32f585d9346e316e554c8d9bf7548af9f62141fc'\nhip: Optional[str] = None\n",
        ("2.5.0", "12.4", ""),
    ),
    "2.7.0 cu126 (xpu field)": (
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', "
        "'hip']\n__version__ = '2.7.0+cu126'\ndebug = False\ncuda: Optional[str] = "
        "'12.6'\ngit_version = '134179474539648ba7dee1317959529fbd0e7f89'\nhip: Optional[str] = "
        "None\nxpu: Optional[str] = None\n",
        ("2.7.0", "12.6", ""),
    ),
    "2.10.0a0 source build, CUDA 13.0": (
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', "
        "'hip', 'xpu']\n__version__ = '2.10.0a0+gite67e3d9'\ndebug = False\ncuda: Optional[str] = "
        "'13.0'\ngit_version = 'e67e3d95f3ab863c8b44a6b16ce9f25d40b0d517'\nhip: Optional[str] = "
        "None\nxpu: Optional[str] = None\n",
        ("2.10.0a0", "13.0", ""),
    ),
    "2.3.0 nightly rocm6.0": (
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', "
        "'hip']\n__version__ = '2.3.0.dev20240308+rocm6.0'\ndebug = False\ncuda: Optional[str] = "
        "None\ngit_version = '55e93013211e3d9a52e259aee5df4f6198a3cdcc'\nhip: Optional[str] = "
        "'6.0.32830-d62f6a171'\n",
        ("2.3.0.dev20240308", "", "6.0.32830-d62f6a171"),
    ),
    "torch < 2.0 style (no annotations)": (
        "__version__ = '1.13.1+cu117'\ndebug = False\ncuda = '11.7'\n"
        "git_version = '49444c3e546bf240bed24a101e747422d1f8a0ee'\nhip = None\n",
        ("1.13.1", "11.7", ""),
    ),
}


def _installed_version_file() -> Path:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "version.py"


@pytest.mark.parametrize("name", REAL)
def test_real_version_files_are_read(tmp_path, name):
    text, (version, cuda, hip) = REAL[name]
    path = tmp_path / "version.py"
    path.write_text(text)
    build = fingerprint.torch_build(path)
    assert (build.version, build.cuda, build.hip) == (version, cuda, hip)


def test_the_installed_version_file_is_read_as_torch_reports_it():
    import torch

    build = fingerprint.torch_build()  # the installed file, with its compiled parts checked
    assert build.version == torch.__version__.split("+")[0]
    assert (build.cuda, build.hip) == (torch.version.cuda or "", torch.version.hip or "")
    assert build.rocm == (getattr(torch.version, "rocm", None) or "")


HOSTILE = {
    "annotation with a side effect": (
        "from typing import Optional\n__version__ = '2.5.1+cu124'\n"
        "cuda: globals().__setitem__('cuda', '12.4') or Optional[str] = None\n"
    ),
    "name rebound by an import alias": (
        "from typing import Optional\n__version__ = '2.5.1+cu124'\ncuda: Optional[str] = None\n"
        "from typing import Optional as cuda\n"
    ),
    "name bound twice": "__version__ = '2.5.1'\ncuda = None\ncuda = '12.4'\n",
    "augmented assignment": "__version__ = '2.5.1'\ncuda = '12'\ncuda += '.4'\n",
    "another import": "import os\n__version__ = '2.5.1'\ncuda = None\n",
    "from typing import *": "from typing import *\n__version__ = '2.5.1'\ncuda: Optional[str] "
    "= None\n",
    "Optional rebound": "from typing import Optional\nOptional = dict\n__version__ = "
    "'2.5.1'\ncuda = None\n",
    "annotation other than Optional[str]": (
        "from typing import Optional\n__version__ = '2.5.1'\ncuda: print('x') = None\n"
    ),
    "annotation before the import": "__version__ = '2.5.1'\ncuda: Optional[str] = None\n",
    "a conditional value": "from typing import Optional\n__version__ = '2.5.1'\ncuda: "
    "Optional[str] = '12' if 1 else None\n",
    "a call": "__version__ = '2.5.1'\ncuda = str(12.4)\n",
    "a docstring then code": '"""doc"""\n__version__ = "2.5.1"\nexec("cuda = 1")\n',
    "a walrus in a list": "__all__ = [(cuda := '12.4')]\n__version__ = '2.5.1'\n",
    "__builtins__ rebound": "__builtins__ = {}\n__version__ = '2.5.1'\ncuda = None\n",
    "tuple target": "__version__, cuda = '2.5.1', '12.4'\n",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_anything_else_makes_the_build_unsure_and_debug_says_why(
    tmp_path, caplog, monkeypatch, name
):
    path = tmp_path / "version.py"
    path.write_text(HOSTILE[name])
    with pytest.raises(ValueError):
        fingerprint.parse_version_file(HOSTILE[name])
    fields, notes = torchless.fingerprint(env={}, root=tmp_path, version_file=path)
    assert fields["torch-cuda"] is None and fields["torch"] is None
    assert "cannot be read as plain data" in notes.fallbacks["torch-cuda"]
    # the job-start check on such a file: torch answers, and --debug (DEBUG records) says which line
    # and why
    monkeypatch.setattr(fingerprint, "_version_file", lambda: path)
    with caplog.at_level(logging.DEBUG, logger="kernel_lock.torchless"):
        answer = torchless.current(["torch-cuda"])
    import torch

    assert answer["torch-cuda"] == (torch.version.cuda or "")
    assert "torch-cuda: needs torch" in caplog.text and "line " in caplog.text


def _fake_torch(root: Path, *, extension: bool, libs: tuple[str, ...]) -> Path:
    folder = root / "torch"
    (folder / "lib").mkdir(parents=True)
    (folder / "version.py").write_text(REAL["2.5.0 cu124"][0])
    (folder / "__init__.py").write_text(
        "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n"
    )
    if extension:
        (folder / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
        (folder / "_C.abi3.so").write_bytes(b"")
    for lib in libs:
        (folder / "lib" / f"{lib}.so").write_bytes(b"")
    return folder


@pytest.mark.parametrize(
    "extension, libs, missing",
    [
        (False, ("libc10", "libtorch_cpu", "libtorch_python", "libtorch_cuda"), "_C"),
        (True, ("libc10", "libtorch_python", "libtorch_cuda"), "libtorch_cpu.so"),
        (True, ("libc10", "libtorch_cpu", "libtorch_python"), "libtorch_cuda.so"),  # a CUDA build
        (True, ("libc10", "libtorch_cpu", "libtorch_python", "libtorch_cuda"), None),
    ],
)
def test_a_torch_without_its_compiled_parts_is_not_read(tmp_path, extension, libs, missing):
    folder = _fake_torch(tmp_path, extension=extension, libs=libs)
    build = fingerprint.torch_build(folder / "version.py")
    why = fingerprint._compiled_parts_missing(folder, build)
    if missing is None:
        assert why is None
    else:
        assert why is not None and missing in why


def test_a_broken_torch_is_never_current(tmp_path, lock_file):
    """`import torch` fails (its compiled libraries are gone): the job-start check must not say
    current."""
    import os
    import subprocess
    import sys

    _fake_torch(tmp_path / "site", extension=False, libs=())
    env = dict(
        os.environ, PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    env.pop("KERNEL_LOCK_TRUST", None)
    for argv in (["verify", str(lock_file), "--no-import"], ["verify", str(lock_file)]):
        proc = subprocess.run(
            [sys.executable, "-m", "kernel_probe", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 3, (
            argv,
            proc.stdout,
            proc.stderr,
        )  # not current, and no "unexpected" 1
        assert "torch" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
