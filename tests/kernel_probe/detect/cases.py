"""What the detection tests share: simulated torch modules and machines, fake libraries that
misbehave on import, and installed distributions written by hand (a dist-info with METADATA and
RECORD)."""

from __future__ import annotations

import base64
import hashlib
from types import SimpleNamespace


def props(name, major=0, minor=0, *, gcn=None, memory=64 * 2**30, sms=110):
    p = SimpleNamespace(
        name=name, major=major, minor=minor, total_memory=memory, multi_processor_count=sms
    )
    if gcn is not None:
        p.gcnArchName = gcn
    return p


def fake_torch(*, cuda=None, hip=None, devices=(), arch_list=(), mps=False, xpu=()):
    """A torch-shaped object: enough of torch.version / cuda / backends.mps / xpu for detection."""
    devices = list(devices)

    def no_cuda_init(*_):
        raise AssertionError("this call would initialise CUDA")

    cuda_ns = SimpleNamespace(
        is_available=lambda: bool(devices),
        device_count=lambda: len(devices),
        get_device_properties=(lambda i: devices[i]) if devices else no_cuda_init,
        get_device_capability=(lambda i: (devices[i].major, devices[i].minor))
        if devices
        else no_cuda_init,
        get_device_name=(lambda i: devices[i].name) if devices else no_cuda_init,
        get_arch_list=lambda: list(arch_list),
    )
    xpu_ns = SimpleNamespace(
        is_available=lambda: bool(xpu),
        device_count=lambda: len(xpu),
        get_device_properties=lambda i: xpu[i],
    )
    return SimpleNamespace(
        __version__="2.6.0+fake",
        version=SimpleNamespace(cuda=cuda, hip=hip, xpu=None, git_version="abc", debug=False),
        cuda=cuda_ns,
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps)),
        xpu=xpu_ns,
    )


H100 = dict(
    cuda="12.4",
    devices=[props("NVIDIA H100 80GB HBM3", 9, 0, sms=132)] * 4,
    arch_list=["sm_80", "sm_86", "sm_90"],
)
MI250X = dict(
    hip="6.2.41133-dd7f95766",
    devices=[props("AMD Radeon Graphics", 9, 0, gcn="gfx90a:sramecc+:xnack-")] * 8,
    arch_list=["gfx90a", "gfx942"],
)
MPS = dict(mps=True)
CPU: dict = {}


FAKES = {
    "fake_abort": "import os\nos.abort()\n",
    "fake_hang": "import time\ntime.sleep(1000)\n",
    "fake_raise": "x = 1\nraise RuntimeError('libcudart.so.12: cannot open shared object file')\n",
    "fake_print": "print('hello from fake_print')\nvalue = 42\n",
    "fake_exit": "import os\nos._exit(3)\n",
}


def write_fakes(root):
    """Each of FAKES as a package under ``root``; returns ``root``."""
    for name, source in FAKES.items():
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(source)
    return root


def make_dist(root, name, version, files=(), summary=""):
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
    )
    lines = []
    for rel, content in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        lines.append(f"{rel},sha256={digest},{len(content)}")
    # no files: an empty RECORD
    (info / "RECORD").write_text("".join(line + "\n" for line in lines))
    return info


def write_pkg(root, module, files):
    for rel, content in files.items():
        path = root / module / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
