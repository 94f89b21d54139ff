"""kernel_probe.detect.site: hostname, Slurm variables and site markers, as found."""

from __future__ import annotations

from kernel_probe.detect import site


def test_site_signals(tmp_path):
    systemname = tmp_path / "systemname"
    systemname.write_text("juwelsbooster\n")
    markers = site.SITE_MARKERS + (
        site.SiteMarker("file", str(systemname), "JSC"),
        site.SiteMarker("file", str(tmp_path / "absent"), "nowhere"),
    )
    env = {
        "LUMI_STACK_NAME": "LUMI",
        "SLURM_JOB_ID": "123",
        "SLURM_CLUSTER_NAME": "lumi",
        "HOME": "/users/x",
        "SLURM_SECRET_UNLISTED": "x",
    }
    s = site.detect_site(env, hostname="nid005123", markers=markers)
    assert s["hostname"] == "nid005123"
    assert s["slurm"] == {"SLURM_CLUSTER_NAME": "lumi", "SLURM_JOB_ID": "123"}
    signals = {m["signal"]: m["value"] for m in s["markers"]}
    assert signals["env:LUMI_STACK_NAME"] == "LUMI"
    assert signals[f"file:{systemname}"] == "juwelsbooster"
    assert not any("absent" in k for k in signals)


def test_site_markers_cover_the_issue_list():
    names = {m.name for m in site.SITE_MARKERS}
    wanted = {"LUMI_STACK_NAME", "SYSTEMNAME", "/etc/FZJ/systemname", "CLUSTER_NAME", "NERSC_HOST", "BSC_MACHINE"}
    assert wanted <= names
