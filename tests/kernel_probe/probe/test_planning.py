"""kernel_probe.probe.planning: a ProbeRequest becomes a Plan, or is refused before any work."""

from __future__ import annotations

import pytest

from kernel_lock.slots import SPECS
from kernel_probe.errors import ForcedUnusable, UsageError
from kernel_probe.probe import planning
from kernel_probe.probe.planning import (
    CPU_LARGE_ELEMENTS,
    DEFAULT_PRECISION,
    DEFAULT_REPS,
    DEFAULT_SHAPES,
    Events,
    ProbeRequest,
    large_shape_warning,
    plan,
)

PROBED_BY_DEFAULT = tuple(name for name, spec in SPECS.items() if spec.by_default)

CPU = {"type": "cpu", "arch": ""}
CUDA = {"type": "cuda", "arch": "sm_90"}


@pytest.fixture
def on(monkeypatch):
    """Plan as if on the given device (its facts), without TRITON_INTERPRET."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def device(facts):
        monkeypatch.setattr(planning, "detect_device", lambda: dict(facts))

    device(CPU)
    return device


# ---- refused before any work ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "request_,error,message",
    [
        (ProbeRequest(shapes=("64x",)), UsageError, "--shape '64x': expected ROWSxHIDDEN"),
        (ProbeRequest(shapes=("2048x1024", "0x8")), UsageError, "--shape '0x8'"),
        (ProbeRequest(reps=0), UsageError, "--reps must be a whole number from 1"),
        (ProbeRequest(reps=-3), UsageError, "--reps must be a whole number from 1"),
        (ProbeRequest(precision="fp8"), UsageError, "unknown precision 'fp8'"),
        (
            ProbeRequest(check_only=True, force=True),
            UsageError,
            "--check and --force contradict each other",
        ),
        (ProbeRequest(candidates=("Norm=mylib.X",)), UsageError, "unknown slot 'Norm'"),
        (
            ProbeRequest(candidates=("LayerNorm=mylib._private.X",)),
            UsageError,
            "private or __main__ component",
        ),
        (
            ProbeRequest(slots=("RMSNorm",), pins={"LayerNorm": "torch.layer_norm"}),
            UsageError,
            "--pin LayerNorm=torch.layer_norm: but --slot limits this probe to RMSNorm",
        ),
        (
            ProbeRequest(prefers={"LayerNorm": "torch.rms_norm"}),
            UsageError,
            "--prefer LayerNorm=torch.rms_norm: 'torch.rms_norm' is not a candidate for "
            "LayerNorm (known: ",
        ),
        (
            ProbeRequest(pins={"LayerNorm": "te.layer_norm"}),
            ForcedUnusable,
            "--pin LayerNorm=te.layer_norm: the candidate is unavailable on this machine: runs "
            "on cuda, rocm",
        ),
        (
            ProbeRequest(prefers={"RMSNorm": "torch.compile.rms_norm"}),
            ForcedUnusable,
            "--prefer RMSNorm=torch.compile.rms_norm: the candidate is skipped on this machine",
        ),
    ],
)
def test_a_bad_request_is_refused_with_its_exit_code(on, request_, error, message):
    with pytest.raises(error) as info:
        plan(request_)
    assert type(info.value) is error
    assert message in info.value.problem
    assert info.value.exit_code == (2 if error is UsageError else 3)


@pytest.mark.parametrize(
    "request_,error,fix",
    [
        (
            ProbeRequest(precision="fp8"),
            UsageError,
            "use one of 32-true, bf16-true, 16-true, bf16-mixed, 16-mixed",
        ),
        (
            ProbeRequest(slots=("Linear",), pins={"RMSNorm": "torch.rms_norm"}),
            UsageError,
            "add --slot RMSNorm, or drop --pin",
        ),
        (ProbeRequest(pins={"Linear": "nope"}), UsageError, "--candidate Linear=module.Class"),
        (
            ProbeRequest(pins={"LayerNorm": "torch.compile.layer_norm"}),
            ForcedUnusable,
            "add --with-compile; a pinned or preferred kernel is never silently replaced",
        ),
        (
            ProbeRequest(pins={"LayerNorm": "te.layer_norm"}),
            ForcedUnusable,
            "drop --pin LayerNorm=te.layer_norm, or run on a machine where it can run",
        ),
    ],
)
def test_a_refusal_says_the_fix(on, request_, error, fix):
    with pytest.raises(error) as info:
        plan(request_)
    assert fix in (info.value.fix or "")


def test_a_compile_pin_with_with_compile_is_planned(on):
    p = plan(ProbeRequest(pins={"LayerNorm": "torch.compile.layer_norm"}, with_compile=True))
    assert p.request.pins == {"LayerNorm": "torch.compile.layer_norm"}


# ---- defaults ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "device,kind",
    [(CPU, "cpu"), (CUDA, "gpu"), ({"type": "rocm", "arch": "gfx90a"}, "gpu")],
)
def test_defaults_follow_the_device_kind(on, device, kind):
    on(device)
    p = plan(ProbeRequest())
    assert p.shapes == DEFAULT_SHAPES[kind] and p.shapes_from == "defaults"
    assert p.reps == DEFAULT_REPS[kind]
    assert p.precision == DEFAULT_PRECISION and (p.dtype, p.regime) == ("bfloat16", "mixed")
    assert p.slots == PROBED_BY_DEFAULT and p.deterministic is False
    assert p.profile is None and p.matched == "" and p.problems == () and p.trust == ()
    assert p.device == device


def test_what_was_asked_for_overrides_the_defaults(on):
    p = plan(
        ProbeRequest(
            shapes=("64x32", "8x16x4", "RMSNorm=48x32"),
            precision="32-true",
            slots=("Linear", "RMSNorm"),
            reps=3,
            deterministic=True,
            candidates=("LayerNorm=mylib.FastLayerNorm",),
        )
    )
    assert p.shapes == ("64x32", "8x16x4") and p.shapes_from == ""
    # RMSNorm takes ROWSxHIDDEN: its own shape, not the Linear's ROWSxINxOUT (issue 57)
    assert p.timed_at == {"Linear": ("64x32", "8x16x4"), "RMSNorm": ("48x32",)}
    assert (p.precision, p.dtype, p.regime) == ("32-true", "float32", "true")
    assert p.slots == ("Linear", "RMSNorm") and p.reps == 3 and p.deterministic is True
    assert "custom:mylib.FastLayerNorm" in [c.id for c in p.candidates]
    assert p.trust == (
        "mylib",
    )  # a candidate that is not built in is trusted by the run that offers it


def test_triton_interpret_is_a_problem_of_the_plan(on, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (problem,) = plan(ProbeRequest()).problems
    assert (
        problem.startswith("TRITON_INTERPRET is set:")
        and "never timed and never written" in problem
    )


def test_events_default_to_ignoring_everything():
    events = Events()
    assert events.note("x") is None and events.warn("x") is None and events.begin(3) is None
    assert (
        events.checking("LayerNorm", "a", 1, 3) is None
        and events.timing("Linear", "a", ["8x8"], None) is None
    )
    assert events.done() is None


# ---- the inputs' digest --------------------------------------------------------------------------
def test_the_digest_is_stable_for_the_same_request(on):
    assert plan(ProbeRequest()).digest == plan(ProbeRequest()).digest
    assert plan(ProbeRequest()).digest.startswith("sha256:")


@pytest.mark.parametrize(
    "changed",
    [
        ProbeRequest(shapes=("64x32",)),
        ProbeRequest(precision="32-true"),
        ProbeRequest(slots=("LayerNorm",)),
        ProbeRequest(pins={"LayerNorm": "torch.layer_norm"}),
        ProbeRequest(prefers={"Linear": "torch.linear"}),
        ProbeRequest(candidates=("LayerNorm=mylib.FastLayerNorm",)),
        ProbeRequest(with_compile=True),
        ProbeRequest(deterministic=True),
        ProbeRequest(allow_init_change=True),
        ProbeRequest(strict_dtype=True),
    ],
)
def test_every_input_that_changes_a_verdict_changes_the_digest(on, changed):
    assert plan(changed).digest != plan(ProbeRequest()).digest


@pytest.mark.parametrize(
    "same",
    [
        ProbeRequest(reps=2),
        ProbeRequest(force=True),
        ProbeRequest(timeout=1.0),
        ProbeRequest(command="x"),
    ],
)
def test_how_long_or_how_hard_to_probe_leaves_the_digest(on, same):
    assert plan(same).digest == plan(ProbeRequest()).digest


# ---- large_shape_warning -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "device,shapes,expected",
    [
        ("cpu", ["2048x1024"], None),
        ("cpu", [], None),
        ("cpu", ["4096x4096"], None),  # exactly CPU_LARGE_ELEMENTS: not beyond it
        ("cpu", ["4097x4096"], "4097x4096 is a GPU-sized shape"),
        (
            "cpu",
            ["40320x1024", "64x32", "542080x1024"],
            "40320x1024, 542080x1024 are GPU-sized shapes",
        ),
        ("cuda", ["542080x1024"], None),
        ("rocm", ["542080x1024"], None),
    ],
)
def test_large_shape_warning(device, shapes, expected):
    text = large_shape_warning(device, shapes, 7)
    if expected is None:
        assert text is None
    else:
        assert text.startswith(expected + ": on a CPU")
        assert (
            "(7 repetitions, plus warm-up)" in text
            and f"({DEFAULT_SHAPES['cpu'][0]}: drop --shape)" in text
        )


def test_the_large_threshold_is_eight_cpu_default_shapes():
    rows, hidden = (int(n) for n in DEFAULT_SHAPES["cpu"][0].split("x"))
    assert 8 * rows * hidden == CPU_LARGE_ELEMENTS


def test_a_shape_is_one_input_however_it_is_spelled(on):
    # issue 37: `--shape 2048*1024` counted as other options than 2048x1024, and re-probed a current
    # lock
    spelled = plan(ProbeRequest(shapes=("2048*1024", "64X32")))
    assert spelled.shapes == ("2048x1024", "64x32")
    assert spelled.digest == plan(ProbeRequest(shapes=("2048x1024", "64x32"))).digest


# ---- --shape's forms (issue 57) ------------------------------------------------------------------
def test_a_three_part_shape_for_a_norm_is_refused_with_its_reading_and_the_form_to_use(on):
    """`--shape 8x4096x1024` (batch x sequence x hidden) was taken as ROWSxINxOUT and LayerNorm
    timed at 8 rows of 4096: refused, saying how it reads and what to write instead."""
    with pytest.raises(UsageError) as info:
        plan(ProbeRequest(shapes=("8x4096x1024",)))
    exc = info.value
    assert exc.exit_code == 2
    assert exc.problem.startswith(
        "--shape 8x4096x1024: read as ROWSxINxOUT (8 rows, 4096 in, 1024 out), as Linear takes "
        "it, so 8 rows, not 8*4096; LayerNorm, RMSNorm, Activation take ROWSxHIDDEN"
    ), exc.problem
    assert "the rows are 8*4096: --shape 32768x1024 (" in exc.fix
    assert "--shape LayerNorm=32768x1024, --shape Linear=32768x1024xOUT" in exc.fix
    assert "--model SPEC" in exc.fix
    with pytest.raises(UsageError, match="LayerNorm=8x4096x1024: .* LayerNorm takes ROWSxHIDDEN"):
        plan(ProbeRequest(shapes=("LayerNorm=8x4096x1024",), slots=("LayerNorm",)))


def test_a_three_part_shape_is_linears_and_each_slot_may_have_its_own(on):
    alone = plan(ProbeRequest(shapes=("8x4096x1024",), slots=("Linear",)))
    assert alone.timed_at == {"Linear": ("8x4096x1024",)}
    request = ProbeRequest(
        shapes=("32768x1024", "Linear=32768x1024x4096", "LayerNorm=8192x1024"),
        slots=("LayerNorm", "RMSNorm", "Linear", "Attention"),
    )
    p = plan(request)
    assert p.shapes == ("32768x1024",)
    assert p.timed_at["LayerNorm"] == ("8192x1024",) and p.timed_at["RMSNorm"] == ("32768x1024",)
    assert p.timed_at["Linear"] == ("32768x1024x4096",)
    assert p.timed_at["Attention"] == ("4x32x256",)  # its own geometry, as before
    # digested in one order whatever the order given; a probe without them keeps its digest
    assert p.inputs["slot_shapes"] == ["LayerNorm=8192x1024", "Linear=32768x1024x4096"]
    swapped = request.shapes[:1] + request.shapes[:0:-1]
    assert plan(ProbeRequest(shapes=swapped, slots=request.slots)).digest == p.digest
    plain = plan(ProbeRequest(shapes=("32768x1024",), slots=request.slots))
    assert "slot_shapes" not in plain.inputs and plain.digest != p.digest


@pytest.mark.parametrize(
    "shapes,slots,problem,fix",
    [
        (("layernorm=8x8",), (), "'layernorm' is not a slot this probe covers", "did you mean"),
        (("RMSNorm=8x8",), ("Linear",), "'RMSNorm' is not a slot", "add --slot RMSNorm"),
        (("Attention=2x8",), (), "Attention is not timed at a --shape", "use --attention"),
        (("LayerNorm=8xq",), (), "--shape 'LayerNorm=8xq': expected ROWSxHIDDEN", None),
    ],
)
def test_a_slots_own_shape_is_refused_where_it_cannot_mean_anything(
    on, shapes, slots, problem, fix
):
    with pytest.raises(UsageError) as info:
        plan(ProbeRequest(shapes=shapes, slots=slots))
    assert info.value.exit_code == 2 and problem in info.value.problem
    assert fix is None or fix in info.value.fix
