"""LUMI-G, Frontier and NVIDIA nodes, simulated in-process (issue 15).

No AMD GPU is reachable from here, so each node is simulated the way its users meet it: the real
torch module's device surface is patched to what that node reports (``torch.version.hip/cuda/rocm``,
``torch.cuda.*`` with real device names, gcnArchName strings and version strings, torch's own
visibility parsing), the host name and the environment are set, and the real code paths run:
fingerprint, ``kernel-probe env``, ``profiles match``, ``--profile`` on the probe, lock
verification, candidate gating.

Facts and where they come from:
- HIP versions with a git hash are what torch's ROCm wheels up to 2.9 report (pytorch issues
  #166068, #166085): 6.2.41133-dd7f95766 (ROCm 6.2, torch 2.5), 6.2.41134-65d174c3e (ROCm 6.2.4: the
  LUMI container lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1), 6.3.42131-fa1d09cbd (ROCm
  6.3), 6.4.43484-123eb5128 (ROCm 6.4). pytorch PR #168097 (torch 2.10) dropped the hash and added
  torch.version.rocm; its example hipcc version is 7.1.25421.
- An MI250X GCD: gcnArchName "gfx90a:sramecc+:xnack-", torch capability (9, 0), 110 CUs, 64 GiB;
  8 per LUMI-G node (lumi-userguide docs/hardware/lumig.md). Its name depends on libdrm's
  amdgpu.ids: "AMD Instinct MI250X" (PCI id 7408), "AMD Instinct MI250X / MI250" (740C),
  "AMD Radeon Graphics" (no amdgpu.ids), "" (seen with ROCm 5.4-6.0) - pytorch PR #147791.
- LUMI's driver amdgpu 6.3.60300 (LUMI-training-materials User-Updates/Update-202601).
- H100: "NVIDIA H100 80GB HBM3", sm_90; A100: "NVIDIA A100-SXM4-40GB", sm_80.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kernel_lock
from kernel_lock import fingerprint, host
from kernel_lock.errors import DeviceVisibilityError, LockMismatch
from kernel_lock.fingerprint import in_spec, release_text
from kernel_lock.lock import KernelLock
from kernel_lock.schema import Slot
from kernel_probe import profile_match, sites
from kernel_probe.candidates import builtin
from kernel_probe.probe import pipeline
from kernel_probe.probe import write as lockwrite
from kernel_probe.probe.check import check_candidate
from kernel_probe.profiles import ProfileError, load_file
from tests.conftest import run_cli
from tests.kernel_probe.detect.cases import make_dist, write_pkg

GIB = 1 << 30


@dataclass(frozen=True)
class Node:
    torch_version: str
    hip: str | None
    cuda: str | None
    rocm: str | None
    devices: tuple[SimpleNamespace, ...]
    arch_list: tuple[str, ...]
    driver: str
    hostname: str
    env: dict[str, str] = field(default_factory=dict)


def gcd(
    name: str = "AMD Instinct MI250X", features: str = "sramecc+:xnack-", index: int = 0
) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        gcnArchName=f"gfx90a:{features}" if features else "gfx90a",
        major=9,
        minor=0,
        total_memory=64 * GIB,
        multi_processor_count=110,
        uuid=f"GPU-{index:016x}",
    )


def nvidia(name: str, major: int, minor: int, memory: int, sms: int) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        major=major,
        minor=minor,
        total_memory=memory * GIB,
        multi_processor_count=sms,
        uuid="GPU-5e1f0000-0000-0000-0000-000000000000",
    )


ROCM_ARCHS = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100")
CUDA_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")

# torch builds a LUMI or Frontier user meets: (torch.__version__, torch.version.hip,
# torch.version.rocm)
ROCM_BUILDS = {
    "torch 2.5 / ROCm 6.2": ("2.5.1+rocm6.2", "6.2.41133-dd7f95766", None),
    "torch 2.7 / ROCm 6.2.4 (LUMI container)": ("2.7.1+rocm6.2.4", "6.2.41134-65d174c3e", None),
    "torch 2.8 / ROCm 6.3": ("2.8.0+rocm6.3", "6.3.42131-fa1d09cbd", None),
    "torch 2.9 / ROCm 6.4": ("2.9.1+rocm6.4", "6.4.43484-123eb5128", None),
    "torch 2.10 / ROCm 7.0": ("2.10.0+rocm7.0", "7.0.51831", "7.0.0"),
}

LUMI_STACK = {
    "LUMI_STACK_NAME": "LUMI",
    "LUMI_STACK_VERSION": "25.03",
    "LUMI_STACK_PARTITION": "G",
    "SLURM_JOB_PARTITION": "standard-g",
    "SLURM_LOCALID": "0",
}
LUMI_AI_FACTORY = {
    "SLURM_JOB_PARTITION": "small-g",
    "SLURM_LOCALID": "0",
}  # `module purge`: no LUMI_* at all


def lumi(
    build: str = "torch 2.7 / ROCm 6.2.4 (LUMI container)",
    env: dict[str, str] | None = None,
    name: str = "AMD Instinct MI250X",
    features: str = "sramecc+:xnack-",
    host: str = "nid005123",
) -> Node:
    version, hip, rocm = ROCM_BUILDS[build]
    return Node(
        version,
        hip,
        None,
        rocm,
        tuple(gcd(name, features, i) for i in range(8)),
        ROCM_ARCHS,
        "6.3.60300",
        host,
        dict(LUMI_STACK if env is None else env),
    )


FRONTIER = Node(
    "2.10.0+rocm7.1",
    "7.1.25421",
    None,
    "7.1.1",
    tuple(gcd(index=i) for i in range(8)),
    ROCM_ARCHS,
    "6.14.14",
    "frontier01234",
    {"SLURM_CLUSTER_NAME": "frontier", "SLURM_JOB_PARTITION": "batch"},
)
H100 = Node(
    "2.9.1+cu128",
    None,
    "12.8",
    None,
    (nvidia("NVIDIA H100 80GB HBM3", 9, 0, 80, 132),) * 4,
    CUDA_ARCHS,
    "570.133.20",
    "as01r1b01",
    {"BSC_MACHINE": "mn5"},
)
A100 = Node(
    "2.9.1+cu128",
    None,
    "12.8",
    None,
    (nvidia("NVIDIA A100-SXM4-40GB", 8, 0, 40, 108),) * 4,
    CUDA_ARCHS,
    "550.54.15",
    "jwb0042",
    {"SYSTEMNAME": "juwelsbooster"},
)

_CLEARED = (
    "LUMI_",
    "SLURM_",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "BSC_MACHINE",
    "SYSTEMNAME",
    "CLUSTER_NAME",
    "NERSC_HOST",
    *fingerprint.NUMERICS_ENV,
)


@pytest.fixture
def node(monkeypatch, tmp_path):
    """``node(NODE)`` makes this process look like NODE to everything that asks torch or the OS."""
    import os

    def apply(n: Node, **env: str) -> Node:
        for name in list(os.environ):
            if name.startswith(_CLEARED):
                monkeypatch.delenv(name)
        for name, value in {**n.env, **env}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(torch, "__version__", n.torch_version)
        monkeypatch.setattr(torch.version, "hip", n.hip)
        monkeypatch.setattr(torch.version, "cuda", n.cuda)
        monkeypatch.setattr(torch.version, "rocm", n.rocm, raising=False)

        def device_count() -> int:
            # torch's own parser of CUDA/HIP/ROCR_VISIBLE_DEVICES: it raises on HIP > ROCR, as on a
            # node
            return min(len(torch.cuda._parse_visible_devices()), len(n.devices))

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", device_count)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: n.devices[i])
        monkeypatch.setattr(
            torch.cuda,
            "get_device_capability",
            lambda i=0: (n.devices[i].major, n.devices[i].minor),
        )
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: n.devices[i].name)
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(n.arch_list))
        # the torch path, as without nvidia-ml-py
        monkeypatch.setattr(host, "nvml_devices", lambda: None)
        monkeypatch.setattr(host, "driver_version", lambda kind: n.driver)
        monkeypatch.setattr(socket, "gethostname", lambda: n.hostname)
        return n

    return apply


def match(name: str, capsys) -> tuple[int, dict]:
    code, out, err = run_cli(["profiles", "match", name, "--json"], capsys)
    return code, json.loads(out) if out.strip() else {"stderr": err}


def lock_for_here(**match_rules: str) -> KernelLock:
    env = lockwrite.environment(fingerprint.current(), {})
    for name, rule in match_rules.items():
        env.fields[name] = replace(env.fields[name], match=rule)
    slot = Slot(
        name="LayerNorm",
        implementation="torch.layer_norm",
        target="torch.nn.LayerNorm",
        semantics="layer_norm",
        kwargs={"eps": 1e-5},
    )
    return KernelLock(created_by="test", environment=env, slots={"LayerNorm": slot}).sealed()


# ---- 1. hashed HIP versions: compared by their release part, everywhere --------------------------
@pytest.mark.parametrize("build", list(ROCM_BUILDS))
def test_lumi_profile_accepts_every_rocm_build_of_torch(build, node, capsys):
    n = node(lumi(build))
    fp = fingerprint.current()
    assert fp["torch-hip"] == n.hip and fp["torch-rocm"] == (n.rocm or "")  # recorded as reported
    assert fp["device-type"] == "rocm" and fp["device-arch"] == "gfx90a" and fp["device-count"] == 8
    code, result = match("lumi-g", capsys)
    assert code == 0, result
    assert result["profile"] == "lumi-g" and result["unmet"] == []


def test_hashed_versions_compare_by_release():
    assert release_text("6.2.41134-65d174c3e") == "6.2.41134"
    assert in_spec(">=6.1,<7.1", "6.2.41134-65d174c3e") and in_spec(">=6.0", "6.4.43484-123eb5128")
    assert not in_spec(">=6.1,<7.1", "7.1.25421") and not in_spec(">=6.1", "6.0.32830-d62f6a171")
    assert not in_spec(">=6.0", "") and not in_spec(">=6.0", "unknown")
    # the fingerprint uses the same rule: a hash never makes two HIP builds differ
    assert fingerprint.field_matches(
        "version", "compatible", "6.2.41134-65d174c3e", "6.2.41133-dd7f95766"
    )
    assert not fingerprint.field_matches(
        "version", "compatible", "6.2.41134-65d174c3e", "6.3.42131-fa1d09cbd"
    )


def test_lumi_bounds_the_rocm_user_space_by_its_driver(node, capsys):
    node(replace(lumi(), torch_version="2.11.0+rocm7.1", hip="7.1.25421", rocm="7.1.1"))
    code, result = match("lumi-g", capsys)
    assert code == 4
    assert result["unmet"] == [
        {"group": "versions", "field": "torch-hip", "expected": ">=6.1,<7.1", "found": "7.1.25421"}
    ]


@pytest.mark.parametrize(
    "build", ["torch 2.7 / ROCm 6.2.4 (LUMI container)", "torch 2.10 / ROCm 7.0"]
)
def test_frontier_accepts_hashed_and_plain_hip_versions(build, node, capsys):
    version, hip, rocm = ROCM_BUILDS[build]
    node(replace(FRONTIER, torch_version=version, hip=hip, rocm=rocm))
    assert match("frontier", capsys)[0] == 0
    node(FRONTIER)
    code, result = match("auto", capsys)
    assert (
        code == 0
        and result["profile"] == "frontier"
        and result["matched"] == "slurm-cluster:frontier"
    )


# ---- 2. the ROCm fork of transformer-engine is not NVIDIA's --------------------------------------
def _transformer_engine(root, *, fork: bool):
    files = {
        "__init__.py": "# This file was modified for portability to AMDGPU\n"
        if fork
        else "# NVIDIA\n",
        "pytorch/__init__.py": "",
    }
    if fork:
        files["_rocm_init.py"] = ""
    write_pkg(root, "transformer_engine", files)
    make_dist(root, "transformer-engine", "2.4.0")


def test_lumi_accepts_the_rocm_transformer_engine_fork(node, tmp_path, monkeypatch, capsys):
    _transformer_engine(tmp_path, fork=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    node(lumi())
    assert profile_match.library_facts(
        ["transformer-engine", "transformer-engine@nvidia", "transformer-engine@rocm-fork"]
    ) == {
        "transformer-engine": "2.4.0",
        "transformer-engine@nvidia": None,
        "transformer-engine@rocm-fork": "2.4.0",
    }
    code, result = match("lumi-g", capsys)
    assert code == 0, result
    code, result = match("auto", capsys)
    assert code == 0 and result["profile"] == "lumi-g"
    # and its candidates are allowed there, judged by the checks like any other
    prof = sites.resolve("lumi-g", [])
    assert (
        "te.layer_norm" in prof.slots["LayerNorm"].allowed
        and "te.rms_norm" in prof.slots["RMSNorm"].allowed
    )


def test_lumi_refuses_nvidia_transformer_engine(node, tmp_path, monkeypatch, capsys):
    _transformer_engine(tmp_path, fork=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    node(lumi())
    code, result = match("lumi-g", capsys)
    assert code == 4
    assert result["unmet"] == [
        {
            "group": "forbidden",
            "field": "library transformer-engine@nvidia",
            "expected": "not installed",
            "found": "2.4.0",
        }
    ]


def test_unknown_library_variant_in_a_profile_is_an_error(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text(
        'profile-version = "1"\nname = "p"\nsources = ["x"]\n[requires]\ndevice-type = ["rocm"]\n'
        '[requires.forbidden]\n"transformer-engine@amd" = ""\n'
    )
    code, _, err = run_cli(["profiles", "check", str(path)], capsys)
    assert code == 5 and "requires.forbidden.transformer-engine@amd" in err and "rocm-fork" in err


# ---- 3. one GCD, three names: a lock travels between container and venv -------------------------
SPELLINGS = ["AMD Instinct MI250X", "AMD Instinct MI250X / MI250", "AMD Radeon Graphics", ""]


@pytest.mark.parametrize("written", SPELLINGS[:2])
@pytest.mark.parametrize("read", SPELLINGS)
def test_lock_verifies_under_every_spelling_of_the_mi250x(written, read, node):
    node(lumi(name=written))
    lock = kernel_lock.loads(lock_for_here().dumps())
    assert lock.environment.fields["device-name"].match == "ignore"
    node(lumi(name=read))
    notes = lock.verify()
    if read != written:
        assert any("device-name differs" in n for n in notes)
    if read in ("", "AMD Radeon Graphics"):
        assert any("does not identify the device" in n and "gfx90a" in n for n in notes)


def test_device_name_stays_exact_on_nvidia(node):
    node(H100)
    lock = lock_for_here()
    node(replace(H100, devices=(nvidia("NVIDIA H100 PCIe", 9, 0, 80, 114),) * 4))
    with pytest.raises(LockMismatch) as info:
        lock.verify()
    assert [d.field for d in info.value.differences] == ["device-name"]


def test_env_notes_a_generic_device_name(node, capsys):
    node(lumi("torch 2.10 / ROCm 7.0", name="AMD Radeon Graphics"))
    code, out, _ = run_cli(["env", "--json", "--no-import-checks"], capsys)
    report = json.loads(out)
    assert code == 0 and report["device"]["type"] == "rocm"
    assert report["torch"]["rocm"] == "7.0.0" and report["fingerprint"]["torch-rocm"] == "7.0.0"
    assert report["torch"]["hip"] == "7.0.51831"
    assert all("generic device name" in " ".join(d["notes"]) for d in report["accelerators"])


# (4. PyPI triton carries the AMD backend too: test_triton.py; ROCm forks labelled as forks:
# test_libraries.py)


# ---- 5. LUMI recognised in its container workflow -----------------------------------------------
@pytest.mark.parametrize(
    ("env", "host", "signal"),
    [
        (LUMI_STACK, "nid005123", "env:LUMI_STACK_PARTITION=G"),
        # `module purge` first: no LUMI_* variables; partition and host name together decide
        (LUMI_AI_FACTORY, "nid005123", "slurm-partition:small-g + hostname:nid005123"),
        (
            {"SLURM_JOB_PARTITION": "dev-g"},
            "nid007977",
            "slurm-partition:dev-g + hostname:nid007977",
        ),  # the last
        (
            {"SLURM_JOB_PARTITION": "standard-g"},
            "nid005000",
            "slurm-partition:standard-g + hostname:nid005000",
        ),
    ],
)
def test_auto_recognises_lumi_with_and_without_the_stack(env, host, signal, node, capsys):
    node(lumi(env=env, host=host))
    code, result = match("auto", capsys)
    assert code == 0 and result["profile"] == "lumi-g" and result["matched"] == signal, result


@pytest.mark.parametrize(
    ("env", "host"),
    [
        ({}, "nid007978"),
        ({}, "nid007999"),
        ({}, "nid004999"),
        ({}, "nid005123"),  # a LUMI-G host name alone: every HPE Cray EX system names nodes so
        ({"SLURM_JOB_PARTITION": "dev-g"}, "x1000c0s0b0n0"),  # a LUMI-G partition name alone
        ({"SLURM_JOB_PARTITION": "small-g"}, "nid004999"),
        ({"SLURM_JOB_PARTITION": "gpu"}, "nid005123"),
        ({"LUMI_STACK_NAME": "LUMI", "LUMI_STACK_PARTITION": "C"}, "nid001234"),
        ({"SLURM_JOB_PARTITION": "standard"}, "nid002000"),
    ],
)
def test_auto_does_not_take_other_nodes_for_lumi_g(env, host, node, capsys):
    node(lumi(env=env, host=host))
    code, result = match("auto", capsys)
    assert code == 0 and result["profile"] is None, result


class _Stop(BaseException):
    """Raised by the stand-in for the probe's work: the profile stage is all this test looks at."""


@pytest.mark.parametrize("profile", ["lumi-g", "auto"])
@pytest.mark.parametrize("env", [LUMI_STACK, LUMI_AI_FACTORY], ids=["stack", "ai-factory"])
def test_probe_accepts_lumi_with_its_profile(profile, env, node, tmp_path, monkeypatch, capsys):
    _transformer_engine(tmp_path, fork=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    node(lumi(env=env))
    seen = {}

    def stand_in(plan, events=None):
        seen.update(profile=plan.profile, matched=plan.matched, device=plan.device)
        raise _Stop

    monkeypatch.setattr(pipeline, "probe", stand_in)
    with pytest.raises(_Stop):
        run_cli(["--profile", profile, "--out", tmp_path / "k.toml"], capsys)
    assert seen["profile"].name == "lumi-g" and seen["device"]["arch"] == "gfx90a"
    assert seen["matched"] in (
        "explicit (--profile)",
        "env:LUMI_STACK_PARTITION=G",
        "slurm-partition:small-g + hostname:nid005123",
    )


@pytest.mark.parametrize("name", ["lumi-g", "frontier"])
def test_every_site_fact_in_the_profile_names_its_source(name):
    """Each [detect] and [requires] line cites a numbered source (on the line, or the comment
    above), or says it is kernel-probe's own choice; what is not known is listed in `unknown`."""
    prof = sites.resolve(name, [])
    cited = {int(s[1:].split("]", 1)[0]) for s in prof.sources}
    assert cited == set(range(1, len(prof.sources) + 1))
    section, previous = "", ""
    for line in Path(prof.path).read_text(encoding="utf-8").splitlines():
        if line.startswith("["):
            section, previous = line.strip("[]"), ""
            continue
        key, _, comment = line.partition("#")
        if key.strip() and section.startswith(("detect", "requires")):
            refs = {int(r) for r in re.findall(r"\[(\d+)\]", comment + previous)}
            assert (refs and refs <= cited) or "kernel-probe's own" in comment, (name, line)
        previous = comment if not key.strip() else ""
    assert prof.unknown


# ---- 6. numerics settings and the xnack mode are part of the fingerprint -------------------------
def test_rocm_numerics_settings_are_recorded_and_checked(node):
    node(lumi(), ROCBLAS_INTERNAL_FP16_ALT_IMPL="1")
    fp = fingerprint.current()
    assert fp["numerics-env"] == "ROCBLAS_INTERNAL_FP16_ALT_IMPL=1"
    lock = lock_for_here()
    assert lock.environment.fields["numerics-env"].match == "exact"
    node(lumi())
    with pytest.raises(LockMismatch) as info:
        lock.verify()
    assert [d.field for d in info.value.differences] == ["numerics-env"]
    node(lumi(), ROCBLAS_INTERNAL_FP16_ALT_IMPL="1", HSA_XNACK="1")
    with pytest.raises(LockMismatch):
        lock.verify()


def test_xnack_mode_is_kept(node):
    node(lumi(features="sramecc+:xnack-"))
    fp = fingerprint.current()
    assert fp["device-arch"] == "gfx90a" and fp["device-features"] == "sramecc+:xnack-"
    lock = lock_for_here()
    node(lumi(features="sramecc+:xnack+"))
    with pytest.raises(LockMismatch) as info:
        lock.verify()
    assert [d.field for d in info.value.differences] == ["device-features"]


def test_numerics_settings_do_not_bind_a_cpu_lock(monkeypatch):
    monkeypatch.delenv("HSA_XNACK", raising=False)
    env = lockwrite.environment({**fingerprint.current(), "device-type": "cpu"}, {})
    assert env.fields["numerics-env"].match == "ignore"


# ---- 7. advice that fits the hardware -----------------------------------------------------------
class _NoWorker:
    """Gating happens before any worker is asked; a call here would be a bug in the order."""

    def call(self, *a, **k):
        raise AssertionError("the worker was asked although the hardware rules the candidate out")


def _verdict(cid: str, device: dict) -> tuple[str, str]:
    cand = next(c for c in builtin() if c.id == cid)
    r = check_candidate(
        cand, cand.slots[0], device["type"], [("float32", "true")], _NoWorker(), arch=device["arch"]
    )
    return r.status, " ".join(r.reasons)


def test_no_install_advice_for_what_cannot_run_on_amd(node):
    node(lumi())
    device = fingerprint.device_facts(torch)
    status, why = _verdict("quack.rms_norm", device)
    assert (
        status == "unavailable"
        and "runs on cuda; this device is rocm" in why
        and "pip install" not in why
    )
    # not installed here: the ROCm fork is what to install
    status, why = _verdict("te.layer_norm", device)
    assert (
        status == "unavailable"
        and "ROCm/TransformerEngine" in why
        and "transformer_engine[pytorch]" not in why
    )
    status, why = _verdict("apex.layer_norm", device)
    assert status == "unavailable" and "github.com/ROCm/apex" in why


def test_quack_needs_hopper_or_newer(node):
    node(A100)
    device = fingerprint.device_facts(torch)
    assert device["arch"] == "sm_80"
    status, why = _verdict("quack.rms_norm", device)
    assert status == "unavailable" and "needs a GPU arch sm_90+ on cuda; this one is sm_80" in why
    assert "pip install" not in why
    node(H100)
    status, why = _verdict("quack.rms_norm", fingerprint.device_facts(torch))
    assert (
        status == "unavailable"
        and "not installed: quack-kernels (pip install quack-kernels)" in why
    )
    status, why = _verdict("te.layer_norm", fingerprint.device_facts(torch))
    assert "pip install --no-build-isolation transformer_engine[pytorch]" in why


def test_te_fork_runs_only_on_the_archs_it_documents():
    te = next(c for c in builtin() if c.id == "te.rms_norm")
    assert te.arch_problem("rocm", "gfx90a") is None and te.arch_problem("rocm", "gfx942") is None
    assert "gfx90a or gfx942 or gfx950" in te.arch_problem("rocm", "gfx1100")
    assert te.arch_problem("cuda", "sm_80") is None and te.arch_problem("cuda", "sm_120") is None
    assert "sm_80+" in te.arch_problem("cuda", "sm_75")


def test_a_profile_candidate_declares_archs_and_install(tmp_path):
    path = tmp_path / "site.toml"
    path.write_text(
        'profile-version = "1"\nname = "site"\nsources = ["x"]\n[requires]\ndevice-type = '
        '["cuda"]\n[[candidate]]\nid = "site.norm"\nslots = ["LayerNorm"]\ntarget = '
        '"site_kernels.Norm"\ndevices = ["cuda"]\narchs = { cuda = ["sm_90+"] }\ninstall = { cuda '
        '= "module load site" }\n'
    )
    cand = load_file(path).candidates[0]
    assert cand.arch_problem("cuda", "sm_80") and cand.arch_problem("cuda", "sm_100") is None
    assert cand.install_hint("cuda") == "module load site"
    path.write_text(path.read_text().replace('"sm_90+"', '"hopper"'))
    with pytest.raises(ProfileError, match="candidate\\[0\\].archs.cuda"):
        load_file(path)


# ---- 8. device visibility: the contradiction is an error, and ranks are told apart --------------
def test_more_hip_than_rocr_devices_is_an_error_not_a_cpu_node(node, capsys):
    node(lumi(), ROCR_VISIBLE_DEVICES="3", HIP_VISIBLE_DEVICES="0,1")
    # what torch itself says
    with pytest.raises(RuntimeError, match="HIP_VISIBLE_DEVICES contains more devices"):
        torch.cuda.device_count()
    with pytest.raises(DeviceVisibilityError) as info:
        fingerprint.current()
    assert info.value.exit_code == 2
    assert "HIP_VISIBLE_DEVICES='0,1'" in str(info.value) and "ROCR_VISIBLE_DEVICES='3'" in str(
        info.value
    )
    for argv in (["env", "--json", "--no-import-checks"], ["profiles", "match", "lumi-g"]):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and "ROCR_VISIBLE_DEVICES" in err and "fix:" in err, argv
    code, _, err = run_cli(["--out", "/nonexistent-dir-for-test/k.toml"], capsys)
    assert code == 2 and "HIP_VISIBLE_DEVICES" in err and "unexpected" not in err


def test_each_rank_records_its_node_device(node, capsys):
    node(lumi(), ROCR_VISIBLE_DEVICES="5", SLURM_LOCALID="5")
    code, out, _ = run_cli(["env", "--json", "--no-import-checks"], capsys)
    report = json.loads(out)
    assert code == 0 and len(report["accelerators"]) == 1
    assert report["accelerators"][0]["index"] == 0 and report["accelerators"][0]["physical"] == "5"
    node(lumi(), ROCR_VISIBLE_DEVICES="4,5,6,7", HIP_VISIBLE_DEVICES="2")
    assert host.physical_devices("rocm") == ["6"]
    node(lumi())
    assert host.physical_devices("rocm") is None
