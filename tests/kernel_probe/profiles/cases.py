"""What the profile tests share: the profiles they start from, and helpers that run `kernel-probe
profiles`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernel_lock import fingerprint
from kernel_lock.lock import KernelLock
from kernel_lock.schema import Slot
from kernel_probe import sites
from kernel_probe.probe import write as lockwrite
from tests.conftest import run_cli

BUILTIN_DIR = sites.builtin_dir()


BUILTIN = sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


GPU_PROFILES = [n for n in BUILTIN if n != "cpu"]


SIGNALS = {
    "lumi-g": (
        {"LUMI_STACK_PARTITION": "G"},
        "nid005123",
        None,
        {"type": "rocm", "arch": "gfx90a"},
        {},
    ),
    "frontier": ({}, "frontier01234", "frontier", {"type": "rocm", "arch": "gfx90a"}, {}),
    "leonardo-booster": (
        {"SLURM_JOB_PARTITION": "boost_usr_prod"},
        "lrdn1234.leonardo.local",
        None,
        {"type": "cuda", "arch": "sm_80"},
        {},
    ),
    "juwels-booster": (
        {},
        "jwb0042",
        None,
        {"type": "cuda", "arch": "sm_80"},
        {"/etc/FZJ/systemname": "juwelsbooster"},
    ),
    "marenostrum5-acc": (
        {"BSC_MACHINE": "mn5"},
        "as01r1b01",
        None,
        {"type": "cuda", "arch": "sm_90"},
        {},
    ),
    "alps-gh200": (
        {"CLUSTER_NAME": "clariden"},
        "nid001234",
        None,
        {"type": "cuda", "arch": "sm_90"},
        {},
    ),
    "perlmutter": (
        {"NERSC_HOST": "perlmutter"},
        "nid001234",
        "perlmutter",
        {"type": "cuda", "arch": "sm_80"},
        {},
    ),
    "cpu": ({}, "laptop", None, {"type": "cpu", "arch": ""}, {}),
}


CPU_PROFILE = """profile-version = "1"
name = "mysite"
description = "test site"
sources = ["tests"]
[detect]
env = { MYSITE = "" }
[requires]
device-type = ["cpu"]
torch = ">=2.4"
"""


MALFORMED = [
    ("not toml", "[[[", "", "not valid TOML"),
    ("unknown top key", CPU_PROFILE + "colour = 1\n", "colour", "unknown key"),
    (
        "unknown nested key",
        CPU_PROFILE.replace("torch =", "torchh ="),
        "requires.torchh",
        "did you mean",
    ),
    ("bad specifier", CPU_PROFILE.replace('">=2.4"', '"~~2"'), "requires.torch", "PEP 440"),
    (
        "bad library specifier",
        CPU_PROFILE + '[requires.libraries]\nliger-kernel = "bogus"\n',
        "requires.libraries.liger-kernel",
        "PEP 440",
    ),
    (
        "unknown candidate id",
        CPU_PROFILE + '[policy.LayerNorm]\nallowed = ["liger.layernorm"]\n',
        "policy.LayerNorm.allowed",
        "unknown candidate id 'liger.layernorm'",
    ),
    (
        "candidate for another slot",
        CPU_PROFILE + '[policy.LayerNorm]\npin = "torch.rms_norm"\n',
        "policy.LayerNorm.pin",
        "is for RMSNorm",
    ),
    (
        "pin not allowed",
        CPU_PROFILE + '[policy.RMSNorm]\nallowed = ["torch.rms_norm"]\npin = "liger.rms_norm"\n',
        "policy.RMSNorm.pin",
        "not in policy.RMSNorm.allowed",
    ),
    (
        "unknown slot policy",
        CPU_PROFILE + "[policy.Layernorm]\nallowed = []\n",
        "policy.Layernorm",
        "unknown key",
    ),
    (
        "bad regex",
        CPU_PROFILE.replace('MYSITE = ""', 'MYSITE = "(("'),
        "detect.env.MYSITE",
        "regular expression",
    ),
    (
        "bad version",
        CPU_PROFILE.replace('profile-version = "1"', 'profile-version = "9"'),
        "profile-version",
        "unsupported",
    ),
    ("missing name", CPU_PROFILE.replace('name = "mysite"\n', ""), "name", "required"),
    ("bad name", CPU_PROFILE.replace('"mysite"', '"My Site"'), "name", "lower-case"),
    (
        "wrong type",
        CPU_PROFILE.replace('device-type = ["cpu"]', "device-type = 3"),
        "requires.device-type",
        "list of strings",
    ),
    (
        "bad count",
        CPU_PROFILE + "min-device-count = -1\n",
        "requires.min-device-count",
        "non-negative",
    ),
    (
        "bad precision",
        CPU_PROFILE + '[policy]\nprecision = "fp8"\n',
        "policy.precision",
        "not one of",
    ),
    (
        "bad shape",
        CPU_PROFILE + '[policy]\nshapes = ["0x1"]\n',
        "policy.shapes[0]",
        "positive integers",
    ),
    (
        "bad strictness group",
        CPU_PROFILE + '[strictness]\nwarn = ["everything"]\n',
        "strictness.warn",
        "unknown group",
    ),
    (
        "candidate unknown key",
        CPU_PROFILE
        + '[[candidate]]\nid = "x"\nslots = ["LayerNorm"]\ntarget = "a.B"\ncolour = 1\n',
        "candidate[0].colour",
        "unknown key",
    ),
]


def write_profile(d: Path, extra: str) -> Path:
    d.mkdir(exist_ok=True)
    p = d / "mysite.toml"
    p.write_text(CPU_PROFILE + extra)
    return p


PIN = """
[policy]
shapes = ["256x1000"]
[policy.LayerNorm]
pin = "site.good_layer_norm"
[[candidate]]
id = "site.good_layer_norm"
slots = ["LayerNorm"]
target = "kp_zoo.norms.GoodLayerNorm"
module = "kp_zoo"
twin-target = "torch.nn.LayerNorm"
"""


ROOT = Path(__file__).resolve().parents[3]


GPU_PROFILE = CPU_PROFILE.replace(
    'device-type = ["cpu"]', 'device-type = ["cuda"]'
)  # a GPU site's profile


def check(tmp_path: Path, text: str, capsys, name: str = "mysite") -> tuple[int, str]:
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    code, out, err = run_cli(["profiles", "check", p], capsys)
    return code, out + err


def match(argv: list, capsys) -> tuple[int, dict]:
    code, out, err = run_cli(["profiles", "match", *argv, "--json"], capsys)
    return code, json.loads(out) if out.strip() else {"stderr": err}


# ---- 1. closed-set values, one GPU-arch syntax ---------------------------------------------------
BAD_VALUES = [
    ('device-type = ["CPU"]', "requires.device-type", "did you mean 'cpu'"),
    ('device-type = ["gpu"]', "requires.device-type", "accepted: cuda, rocm, xpu, mps, cpu"),
    ('arch = ["amd64"]', "requires.arch", "did you mean 'x86_64'"),
    ('arch = ["arm64"]', "requires.arch", "did you mean 'aarch64'"),
    ('device-vendor = ["NVIDIA"]', "requires.device-vendor", "did you mean 'nvidia'"),
    ('device-arch = ["9.0"]', "requires.device-arch", "is written 'sm_90'"),
    ('device-arch = ["gfx90a+"]', "requires.device-arch", "gfx archs match exactly"),
    ('device-arch = ["gfx90a"]', "requires.device-arch", "is a rocm arch, not a cuda one"),
]


# ---- 2. contradictions ---------------------------------------------------------------------------
CONTRADICTIONS = [
    (
        '[requires.libraries]\napex = ""\n[requires.forbidden]\napex = ""\n',
        "requires.forbidden.apex",
    ),
    (
        '[requires.libraries]\n"transformer-engine@rocm-fork" = '
        '""\n[requires.forbidden]\ntransformer-engine = ""\n',
        "requires.forbidden.transformer-engine",
    ),
    (
        '[requires.libraries]\napex = ">=0.1"\n[requires.forbidden]\napex = ">=0.1"\n',
        "requires.forbidden.apex",
    ),
]


# ---- 5. weak signals never decide alone ----------------------------------------------------------
def described_node(tmp_path: Path, base: str, **changes) -> Path:
    data = json.loads(sites.examples()[base].read_text())
    for key, value in changes.items():
        data[key] = value
    p = tmp_path / f"{base}-changed.json"
    p.write_text(json.dumps(data))
    return p


PAIRS = [(p, n) for p in BUILTIN for n in BUILTIN if p != n]


SAME_HARDWARE = {
    frozenset(pair)
    for pair in [
        ("juwels-booster", "perlmutter"),
        ("juwels-booster", "leonardo-booster"),
        ("leonardo-booster", "perlmutter"),
        ("frontier", "lumi-g"),
    ]
}


# ---- 6. the profile is part of the lock's identity -----------------------------------------------
def lock_with_profile(path: Path, profile: dict, inputs: str = "inputs-1") -> Path:
    env = lockwrite.environment(fingerprint.current(), {})
    slot = Slot(
        name="LayerNorm",
        implementation="torch.layer_norm",
        target="torch.nn.LayerNorm",
        semantics="layer_norm",
        kwargs={"eps": 1e-5},
    )
    lock = KernelLock(
        created_by="test",
        environment=env,
        slots={"LayerNorm": slot},
        profile=profile,
        provenance={"inputs": inputs},
    )
    lock.sealed().dump(path)
    return path


# ---- issue 24 point 6: profile signals read safely -----------------------------------------------
def files_profile(d: Path, path: str) -> Path:
    d.mkdir(exist_ok=True)
    p = d / "fileprof.toml"
    p.write_text(
        GPU_PROFILE.replace('"mysite"', '"fileprof"').replace(
            'env = { MYSITE = "" }', f'files = {{ "{path}" = "" }}'
        )
    )
    return d


def run_cli_process(argv: list, env_dir: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, sites.ENV_VAR: str(env_dir)}
    return subprocess.run(
        [sys.executable, "-m", "kernel_probe", *map(str, argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sparse_file(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


CATASTROPHIC = [
    "^(a|aa)+$",
    "(a+)+b",
    "^(a*)*$",
    r"(\w+\s?)+$",
    r"(x+x+)+y",
    r"^(.*)\1$",
    "a*a*a*b",
    ".*.*.*x",
]


PLAIN = [
    "^G$",
    "",
    "^(standard-g|small-g|dev-g)$",
    "^nid00(5[0-9]{3}|6[0-9]{3}|7[0-8][0-9]{2}|79[0-6][0-9]|797[0-7])$",
    r"^login[0-9]+\.frontier\.olcf\.ornl\.gov$",
    r"^jwb[0-9]{4}(\.juwels)?$",
    "^(a|b)+$",  # one character class to re: no backtracking
    "^boost_",
]
