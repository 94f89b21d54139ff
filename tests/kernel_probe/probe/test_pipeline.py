"""kernel_probe.probe.pipeline: reusing a current lock, refusing a stale one, and the steps around a
probe.

A real probe (workers, checks, timings) is exercised by the slow tests of the probe command; here
nothing starts a worker (the ``no_workers`` fixture fails the test if anything does).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernel_probe import jobstart
from kernel_probe.errors import InputFileError, StaleLock, UsageError
from kernel_probe.jobstart import run
from kernel_probe.probe import pipeline, planning, stale
from kernel_probe.probe.pipeline import choose_all, reusable
from kernel_probe.probe.planning import ProbeRequest, plan, slot_rules
from kernel_probe.probe.report import Report
from kernel_probe.slots import slot
from tests.conftest import MINIMAL_LOCK, edited_lock, write_sealed

HEAD = 'created-by = "hand"\n'
SHAPE = ("64x32",)


@pytest.fixture
def cpu(monkeypatch, no_workers):
    monkeypatch.setattr(planning, "detect_device", lambda: {"type": "cpu", "arch": ""})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def probed_with(digest: str, text: str = MINIMAL_LOCK) -> str:
    """``text`` as a lock probed with the inputs whose digest is ``digest``."""
    return text.replace(HEAD, f'{HEAD}provenance = {{ inputs = "{digest}" }}\n', 1)


@pytest.fixture
def current(tmp_path, cpu):
    """(a request, the path of a lock that is current for it)."""
    request = ProbeRequest(out=tmp_path / "kernel-lock.toml", shapes=SHAPE)
    return request, write_sealed(request.out, probed_with(plan(request).digest))


# ---- reusable ------------------------------------------------------------------------------------
def test_a_current_lock_is_reusable(current):
    request, path = current
    lock, why = reusable(path, plan(request).digest)
    assert (
        why == "" and lock.intact and lock.slots["LayerNorm"].implementation == "torch.layer_norm"
    )


@pytest.mark.parametrize(
    "make,why",
    [
        (lambda d, digest: d / "absent.toml", "absent.toml does not exist"),
        (
            lambda d, digest: write_sealed(d / "l.toml", probed_with("sha256:" + "0" * 64)),
            "it was probed with other options (shapes, precision, candidates, pins or profile)",
        ),
        (
            lambda d, digest: write_sealed(d / "l.toml"),
            "it was probed with other options",
        ),  # no inputs recorded
        (
            lambda d, digest: write_sealed(
                d / "l.toml", probed_with(digest, edited_lock(**{'"cpu"': '"cuda"'}))
            ),
            "this machine differs: ",
        ),
    ],
    ids=["absent", "other-inputs", "no-inputs", "other-machine"],
)
def test_a_lock_that_is_not_current_says_why(tmp_path, cpu, make, why):
    digest = plan(ProbeRequest(shapes=SHAPE)).digest
    lock, reason = reusable(make(tmp_path, digest), digest)
    assert lock is None and why in reason


@pytest.mark.parametrize(
    "content,problem",
    [
        ("not = [toml", "the existing lock is not valid: "),
        (
            MINIMAL_LOCK.replace(HEAD, HEAD + f'digest = "sha256:{"0" * 64}"\n'),
            "was edited by hand",
        ),
    ],
    ids=["corrupt", "hand-edited"],
)
def test_a_lock_that_cannot_be_trusted_is_an_error_not_a_reprobe(tmp_path, content, problem):
    path = tmp_path / "kernel-lock.toml"
    path.write_text(content)
    with pytest.raises(InputFileError) as info:
        reusable(path, "sha256:x")
    assert problem in info.value.problem and "--force" in info.value.fix
    assert info.value.path == str(path) and info.value.exit_code == InputFileError.exit_code
    assert path.read_text() == content  # nothing was overwritten


# ---- run, on a lock that is current or stale: no probe -------------------------------------------
def test_run_reuses_a_current_lock(current):
    request, path = current
    for asked in (request, replace(request, check_only=True)):
        result = run(asked)
        assert (
            result.reused
            and result.lock_path == path
            and result.choices == {}
            and result.reports == {}
        )
        assert result.lock.provenance["inputs"] == result.plan.digest


@pytest.mark.parametrize(
    "request_change,why",
    [
        ({}, "does not exist"),
        ({"precision": "32-true"}, "it was probed with other options"),
    ],
)
def test_check_only_refuses_a_stale_lock(current, tmp_path, request_change, why):
    request, path = current
    if not request_change:
        path.unlink()
    with pytest.raises(StaleLock) as info:
        run(replace(request, check_only=True, **request_change))
    assert (
        info.value.problem.startswith(f"{path} is stale or missing: ") and why in info.value.problem
    )
    assert info.value.exit_code == 3 and "without --check" in info.value.fix


def test_run_refuses_a_bad_request_before_any_work(tmp_path, cpu):
    with pytest.raises(UsageError, match="--check and --force contradict each other"):
        run(ProbeRequest(out=tmp_path / "l.toml", check_only=True, force=True))
    assert not (tmp_path / "l.toml").exists()


@pytest.mark.parametrize("mode", ["node", "everyone"])
def test_run_refuses_an_unknown_probe_per(tmp_path, cpu, mode):
    with pytest.raises(UsageError, match=f"--probe-per '{mode}': use one of "):
        run(ProbeRequest(out=tmp_path / "l.toml", probe_per=mode))


# ---- the steps -----------------------------------------------------------------------------------
def test_expand_out(cpu, monkeypatch):
    monkeypatch.setattr(jobstart, "node_type", lambda device: f"{device['type']}-kind")
    p = plan(ProbeRequest())
    assert jobstart._expand_out(ProbeRequest(out=Path("a/lock.toml")), p, "job") == Path(
        "a/lock.toml"
    )
    assert jobstart._expand_out(ProbeRequest(out=Path("a/{node-type}.toml")), p, "job") == Path(
        "a/cpu-kind.toml"
    )
    assert jobstart._expand_out(ProbeRequest(out=Path("{node-type}.toml")), p, "node-type") == Path(
        "cpu-kind.toml"
    )
    with pytest.raises(UsageError, match=r"--out a/lock.toml names no \{node-type\}") as info:
        jobstart._expand_out(ProbeRequest(out=Path("a/lock.toml")), p, "node-type")
    assert "kernel-lock.{node-type}.toml" in info.value.fix


def test_job_rank_without_a_launcher(cpu):
    assert jobstart._job_rank("rank", planning.Events()) is None
    # conftest clears the launchers' rank variables
    assert jobstart._job_rank("job", planning.Events()) is None


def site(**slots) -> SimpleNamespace:
    """A stand-in for a profile: its name and per-slot policy."""
    policy = {
        slot: SimpleNamespace(
            allowed=tuple(p["allowed"]) if "allowed" in p else None,
            pin=p.get("pin"),
            preferred=tuple(p.get("prefer", ())),
        )
        for slot, p in slots.items()
    }
    return SimpleNamespace(name="site", slots=policy)


@pytest.mark.parametrize(
    "profile,cid,refused",
    [
        (None, "liger.rms_norm", None),
        (site(), "liger.rms_norm", None),
        (site(RMSNorm={}), "liger.rms_norm", None),  # no allow-list: everything allowed
        (site(RMSNorm={"allowed": ["torch.rms_norm"]}), "torch.rms_norm", None),
        (
            site(RMSNorm={"allowed": ["torch.rms_norm"]}),
            "liger.rms_norm",
            "not allowed by profile site",
        ),
        (
            site(LayerNorm={"allowed": ["torch.layer_norm"]}),
            "liger.rms_norm",
            None,
        ),  # another slot's list
        (
            site(RMSNorm={"allowed": []}),
            "torch.rms_norm",
            "not allowed by profile site",
        ),  # [] allows nothing
    ],
)
def test_refused_by_the_profiles_allow_list(cpu, profile, cid, refused):
    p = plan(ProbeRequest())
    # as plan() derives them
    p = replace(p, profile=profile, rules=slot_rules(p.slots, {}, {}, profile))
    assert pipeline._refused(p, "RMSNorm", SimpleNamespace(id=cid)) == refused


def reports_and_timings(slot: str, semantics: str, ms: dict[str, float]):
    reports = [Report(cid, f"x.{cid}", slot, semantics, "cpu", "accepted") for cid in ms]
    base = next(iter(ms.values()))  # the first is the default: the others paired with it
    timings = {cid: [{"shape": SHAPE[0], "median_ms": t}] for cid, t in ms.items()}
    for row in (rows[0] for rows in list(timings.values())[1:]):
        row["pairs"] = [[base, row["median_ms"]]] * 7
    return reports, timings


@pytest.mark.parametrize(
    "request_change,profile,chosen,how",
    [
        ({}, None, "liger.rms_norm", "fastest"),
        ({"pins": {"RMSNorm": "torch.rms_norm"}}, None, "torch.rms_norm", "pinned"),
        (
            {},
            site(RMSNorm={"pin": "torch.rms_norm"}),
            "torch.rms_norm",
            "pinned",
        ),  # the profile's policy
        ({}, site(RMSNorm={"prefer": ["torch.rms_norm"]}), "torch.rms_norm", "preferred"),
        # the command line's pin wins over the profile's
        (
            {"pins": {"RMSNorm": "liger.rms_norm"}},
            site(RMSNorm={"pin": "torch.rms_norm"}),
            "liger.rms_norm",
            "pinned",
        ),
    ],
)
def test_choose_all(cpu, request_change, profile, chosen, how):
    p = plan(ProbeRequest(slots=("RMSNorm",), shapes=SHAPE, precision="32-true"))
    request = replace(p.request, **request_change)
    p = replace(
        p,
        request=request,
        profile=profile,
        rules=slot_rules(p.slots, request.pins, request.prefers, profile),
    )
    reports, timings = reports_and_timings(
        "RMSNorm", "rms_norm", {"torch.rms_norm": 1.0, "liger.rms_norm": 0.5}
    )
    (choice,) = choose_all(p, {"RMSNorm": reports}, {"RMSNorm": timings}).values()
    assert (choice.slot, choice.report.id, choice.how) == ("RMSNorm", chosen, how)
    if profile is not None and "pins" not in request_change:
        assert "profile site" in choice.reason


# ---- a CPU whose bf16 matmul is emulated (issue 38) ----------------------------------------------
def _warnings(device: str, dtype: str, slots=("LayerNorm", "RMSNorm", "Linear")) -> list[str]:
    """What a probe of ``slots`` warns about up front (each slot's ``Slot.warnings``)."""
    return [w for name in slots for w in slot(name).warnings(device, dtype)]


def test_an_emulated_regime_is_said_up_front_and_one_calls_time_after(monkeypatch):
    from kernel_probe.detect import host

    monkeypatch.setattr(host, "cpu_flags", lambda cpuinfo=None: {"avx2"})
    [warning] = _warnings("cpu", "bfloat16")
    assert warning.startswith("bfloat16 matmul is emulated on this CPU")
    assert _warnings("cpu", "float32") == []  # fp32 is never emulated
    # no Linear: no matmul timed
    assert _warnings("cpu", "bfloat16", ("LayerNorm",)) == []
    assert _warnings("cuda", "bfloat16", ("Linear",)) == []
    rows = {
        "torch.linear": [
            {"shape": "2048x1024", "median_ms": 7512.0},
            {"shape": "8x8", "error": "x"},
        ]
    }
    assert slot("Linear").notes("cpu", "bfloat16", rows) == [
        "bfloat16 matmul emulated: one forward+backward of torch.linear at 2048x1024 took 7.51 s"
    ]


def test_a_native_regime_is_not_warned_about(monkeypatch):
    from kernel_probe.detect import host

    monkeypatch.setattr(host, "cpu_flags", lambda cpuinfo=None: {"avx2", "avx512_bf16", "amx_bf16"})
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert _warnings("cpu", "bfloat16") == []


# ---- which options differ (issue 37: "probed with other options" did not say which) --------------
def test_other_options_are_named_with_their_old_and_new_values():
    before = {
        "precision": "bf16-mixed",
        "shapes": ["2048x1024"],
        "pins": {},
        "candidates": ["a=x.A"],
    }
    recorded = stale.recorded_options(before)
    now = {
        "precision": "32-true",
        "shapes": ["64x32"],
        "pins": {"Linear": "torch.linear"},
        "candidates": ["b=y.B"],
    }
    why = stale.options_change(recorded, now)
    assert "--precision: bf16-mixed -> 32-true" in why and "--shape: 2048x1024 -> 64x32" in why
    assert (
        "--pin: none -> Linear=torch.linear" in why
        and "candidates: new b=y.B; no longer a=x.A" in why
    )
    assert stale.options_change(recorded, before).endswith("(the same values, another encoding)")


def test_a_lock_probed_with_other_options_names_them(tmp_path, cpu):
    p = plan(ProbeRequest(shapes=("2048x1024",)))
    text = MINIMAL_LOCK.replace(
        HEAD,
        f'{HEAD}provenance = {{ inputs = "sha256:{"0" * 64}", options = {{ shapes = "4096x512" '
        "} }\n",
        1,
    )
    lock, why = reusable(write_sealed(tmp_path / "l.toml", text), p.digest, inputs=p.inputs)
    assert lock is None and "--shape: 4096x512 -> 2048x1024" in why


# ---- the candidate set (issue 37: a library installed after the probe was never tried) -----------
def probed_seeing(digest: str, libraries: str) -> str:
    return MINIMAL_LOCK.replace(
        HEAD, f'{HEAD}provenance = {{ inputs = "{digest}", libraries = {{ {libraries} }} }}\n', 1
    )


def test_a_library_installed_since_the_probe_makes_the_lock_stale(tmp_path, cpu):
    p = plan(ProbeRequest(shapes=SHAPE, slots=("LayerNorm",)))
    now = dict(p.libraries) | {"liger-kernel": "0.8.5"}
    seen = ", ".join(f'{k} = "{"" if k == "liger-kernel" else v}"' for k, v in now.items())
    path = write_sealed(tmp_path / "l.toml", probed_seeing(p.digest, seen))
    lock, why = reusable(
        path, p.digest, libraries=now, judged={"liger-kernel": ["liger.layer_norm"]}
    )
    assert (
        lock is None
        and "liger-kernel is installed now (0.8.5)" in why
        and "liger.layer_norm never judged" in why
    )
    # and removed since: judged on a library that is gone
    path = write_sealed(
        tmp_path / "l.toml",
        probed_seeing(p.digest, seen.replace('liger-kernel = ""', 'liger-kernel = "0.8.5"')),
    )
    lock, why = reusable(
        path,
        p.digest,
        libraries=now | {"liger-kernel": ""},
        judged={"liger-kernel": ["liger.layer_norm"]},
    )
    assert (
        lock is None
        and "liger-kernel (0.8.5) was installed when the lock was probed and is not now" in why
    )
    # the same libraries: current
    path = write_sealed(
        tmp_path / "l.toml",
        probed_seeing(p.digest, seen.replace('liger-kernel = ""', 'liger-kernel = "0.8.5"')),
    )
    assert reusable(path, p.digest, libraries=now)[1] == ""


def test_an_older_lock_without_the_record_is_judged_by_its_rejected_candidates(tmp_path, cpu):
    p = plan(ProbeRequest(shapes=SHAPE, slots=("LayerNorm",)))
    rejected = (
        '\n[[slots.LayerNorm.rejected]]\nimplementation = "liger.layer_norm"\ntarget = '
        '"liger_kernel.transformers.LigerLayerNorm"\n'
        'status = "unavailable"\nreasons = ["liger-kernel is not installed"]\n'
    )
    path = write_sealed(tmp_path / "l.toml", probed_with(p.digest, MINIMAL_LOCK + rejected))
    lock, why = reusable(
        path,
        p.digest,
        libraries={"liger-kernel": "0.8.5"},
        judged={"liger-kernel": ["liger.layer_norm"]},
    )
    assert lock is None and "liger-kernel is installed now" in why


def test_check_exits_3_naming_the_new_library(tmp_path, cpu, monkeypatch):
    request = ProbeRequest(out=tmp_path / "kernel-lock.toml", shapes=SHAPE, check_only=True)
    p = plan(request)
    assert p.library_candidates.get("liger-kernel")  # the registry's liger candidates are planned
    seen = ", ".join(f'{k} = ""' for k in p.libraries)
    write_sealed(request.out, probed_seeing(p.digest, seen))
    monkeypatch.setattr(
        planning,
        "plan",
        lambda *_a, **_k: replace(p, libraries=dict(p.libraries) | {"liger-kernel": "0.8.5"}),
    )
    monkeypatch.setattr(jobstart, "plan", planning.plan)
    with pytest.raises(StaleLock) as info:
        run(request)
    assert (
        "liger-kernel is installed now (0.8.5)" in info.value.problem and info.value.exit_code == 3
    )


# ---- libraries keyed on their top-level package (issue 52: apex.normalization was never found) ---
def test_apex_installed_after_a_layernorm_probe_makes_the_lock_stale(tmp_path, cpu, monkeypatch):
    request = ProbeRequest(
        out=tmp_path / "kernel-lock.toml", shapes=SHAPE, slots=("LayerNorm",), check_only=True
    )
    p = plan(request)
    assert p.library_candidates["apex"] == ["apex.layer_norm"] and p.libraries["apex"] == ""
    seen = ", ".join(f'{k} = "{v}"' for k, v in p.libraries.items())
    write_sealed(request.out, probed_seeing(p.digest, seen))
    monkeypatch.setattr(
        planning,
        "plan",
        lambda *_a, **_k: replace(p, libraries=dict(p.libraries) | {"apex": "installed"}),
    )
    monkeypatch.setattr(jobstart, "plan", planning.plan)
    with pytest.raises(StaleLock) as info:
        run(request)
    assert "apex is installed now" in info.value.problem and info.value.exit_code == 3
    assert "apex.layer_norm never judged" in info.value.problem


def test_a_lock_that_did_not_record_a_library_is_judged_by_its_rows(tmp_path, cpu):
    """A lock written while apex was keyed by apex.normalization records no apex at all: its
    rejected apex rows (not installed) stand for it; without them nothing is assumed."""
    p = plan(ProbeRequest(shapes=SHAPE, slots=("LayerNorm",)))
    rejected = (
        '\n[[slots.LayerNorm.rejected]]\nimplementation = "apex.layer_norm"\ntarget = '
        '"apex.normalization.FusedLayerNorm"\nstatus = "unavailable"\n'
        'reasons = ["runs on cuda, rocm; this device is cpu (and it is not installed)"]\n'
    )
    seen = 'liger-kernel = "0.8.5"'
    now, judged = {"apex": "installed", "liger-kernel": "0.8.5"}, {"apex": ["apex.layer_norm"]}
    path = write_sealed(tmp_path / "l.toml", probed_seeing(p.digest, seen) + rejected)
    lock, why = reusable(path, p.digest, libraries=now, judged=judged)
    assert lock is None and "apex is installed now (installed)" in why
    path = write_sealed(tmp_path / "l.toml", probed_seeing(p.digest, seen))
    assert reusable(path, p.digest, libraries=now, judged=judged)[1] == ""


# ---- a shape this device cannot time: refused before any worker (issue 56) ----------------------
O96 = "16x64x40320:window=512"


def test_a_size_this_cpu_cannot_time_is_refused_before_any_work(cpu):
    from kernel_probe.errors import TooLarge

    p = plan(ProbeRequest(slots=("Attention",), declared={"Attention": O96}))
    with pytest.raises(TooLarge) as info:
        pipeline.probe(p)  # no worker: the no_workers fixture fails the test if one starts
    assert info.value.exit_code == 3
    assert info.value.problem.startswith(f"Attention at {O96} cannot be timed on this cpu: ")
    assert "(--attention)" in info.value.fix and "--slot for each other slot" in info.value.fix
    # a model's own size: no --attention to lower it
    with pytest.raises(TooLarge) as info:
        pipeline.probe(replace(p, request=replace(p.request, model="m.py:build")))
    assert "--attention" not in info.value.fix and "a GPU node" in info.value.fix
    # the same geometry on a GPU is timed
    gpu = replace(p, device={**p.device, "type": "cuda"}, timed_at={"Attention": (O96,)})
    pipeline.refuse_too_large(gpu, {"Attention": slot("Attention")})
