"""``kernel-probe env``: report this machine (the facts come from kernel_probe.detect)."""

from __future__ import annotations

import argparse
from typing import Any

from kernel_probe import output
from kernel_probe.detect import host
from kernel_probe.detect.importcheck import DEFAULT_TIMEOUT, ImportCache
from kernel_probe.detect.report import detect
from kernel_probe.output import add_flags, safe, seconds

STATUS_STYLE = {
    "ok": "green",
    "error": "red",
    "crashed": "bold red",
    "timeout": "yellow",
    "skipped": "dim",
    "not-installed": "dim",
}


def add_env_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe env``."""
    add_flags(
        p,
        {
            "--no-import-checks": "do not import kernel libraries or Triton (no child processes): "
            "metadata and torch only",
            "--fresh": "import every library again: do not reuse the answers kept from earlier "
            "checks of the same installation on this node (they are kept in "
            "$KERNEL_PROBE_CACHE_DIR, else ~/.cache/kernel-probe)",
        },
    )
    timeout = (
        f"how long each library import check may take (default {DEFAULT_TIMEOUT:g} s, "
        "scaled up by the machine's load per core, at most 6x)"
    )
    p.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS", help=timeout)


def run_env(args: argparse.Namespace) -> int:
    """``kernel-probe env``: this machine and its kernel libraries, as a table or JSON."""
    cache = ImportCache.default(read=not args.fresh)
    report = detect(import_checks=not args.no_import_checks, timeout=args.timeout, cache=cache)
    if args.json:
        output.print_json(report)
    else:
        render(report, output.console())
    return 0


_Rows = list[tuple[str, Any]]


class _Markup(str):
    """A row's value that is rich markup already (what in it came from the report made safe)."""


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _status(entry: dict[str, Any]) -> str:
    status = entry.get("status", "")
    style = STATUS_STYLE.get(status)
    text = f"[{style}]{safe(status)}[/]" if style else safe(status)
    if entry.get("seconds") is not None:
        text += f" in {entry['seconds']:.2f} s"
    if entry.get("cached"):
        text += f" [dim](cached answer of {safe(entry['cached'])})[/]"
    return text


def _host_rows(h: dict[str, Any]) -> _Rows:
    cpu, mem, os_, py = h["cpu"], h["memory"], h["os"], h["python"]
    model, generic = cpu["microarch"], cpu.get("generic")
    if not cpu["model_known"]:
        model = f"unknown model, generic level {generic or cpu['microarch']}"
    elif generic and generic != model:
        model += f" (generic {generic})"
    memory = f"{_gib(mem['total_bytes'])} total, {_gib(mem['available_bytes'])} available"
    if mem.get("cgroup_limit_bytes"):
        memory += f", {_gib(mem['cgroup_limit_bytes'])} cgroup limit"
    cores = str(cpu["cores"])
    if cpu.get("usable_cores") not in (None, cpu["cores"]):
        cores += f" ({cpu['usable_cores']} usable)"
    venv = " (virtualenv)" if py["virtualenv"] else ""
    return [
        ("os", f"{os_.get('distribution') or os_['system']} ({os_['system']} {os_['release']})"),
        ("python", f"{py['version']} {py['implementation']}, {py['executable']}{venv}"),
        ("cpu", f"{cpu['arch']}, {model}" + (f", {cpu['brand']}" if cpu.get("brand") else "")),
        ("cores", cores),
        *[(f"{t} matmul", host.describe(f)) for t, f in (cpu.get("matmul") or {}).items()],
        ("memory", memory),
    ]


def _torch_rows(t: dict[str, Any] | None) -> _Rows:
    if t is None:
        return [("torch", _Markup("[red]not importable[/] (see errors)"))]
    builds = {
        "cuda": f"CUDA {t['cuda']}",
        "rocm": f"HIP {t['hip']}" + (f", ROCm {t['rocm']}" if t.get("rocm") else ""),
        "xpu": f"XPU {t['xpu']}",
    }
    dnn, coll, m = t["dnn"], t["collectives"], t["math"]
    dnn_text = f"{dnn['version']} (compiled {dnn['compiled']})" if dnn["version"] else None
    on = {k: {True: "on", False: "off", None: "n/a"}.get(v, str(v)) for k, v in m.items()}
    warn_only = " (warn only)" if m["deterministic_warn_only"] else ""
    return [
        ("version", f"{t['version']} ({t['location']})"),
        ("built for", builds.get(t["build"], "CPU only")),
        ("device code", " ".join(t["arch_list"]) or "none"),
        (dnn["library"], dnn_text or dnn["error"] or "not loaded"),
        (coll["library"], coll["version"] or coll["error"] or "not in this build"),
        ("cpu kernels", str(t["cpu_capability"])),
        (
            "tf32",
            f"matmul {on['matmul_allow_tf32']}, cudnn {on['cudnn_allow_tf32']}, "
            f"fp32 matmul precision {m['float32_matmul_precision']}",
        ),
        (
            "reductions",
            f"fp16 reduced {on['matmul_allow_fp16_reduced_precision_reduction']}, "
            f"bf16 reduced {on['matmul_allow_bf16_reduced_precision_reduction']}",
        ),
        (
            "determinism",
            f"algorithms {on['deterministic_algorithms']}{warn_only}, cudnn deterministic "
            f"{on['cudnn_deterministic']}, benchmark {on['cudnn_benchmark']}",
        ),
        *t["environment"].items(),
        *(("note", _Markup(f"[yellow]{safe(note)}[/]")) for note in t.get("notes") or ()),
    ]


def _device_rows(devices: list[dict[str, Any]]) -> _Rows:
    rows: _Rows = []
    for d in devices:
        node = f" (node {d['physical']})" if d.get("physical") is not None else ""
        label = f"{d['type']}:{d['index']}{node}"
        if d["type"] == "cpu":
            rows.append((label, f"{d['name']} (no accelerator torch can use)"))
            continue
        parts = [f"{d['vendor']} {d['arch'] or '(arch n/a)'}"]
        if d.get("gcn_arch_name") and d["gcn_arch_name"] != d["arch"]:
            parts[0] += f" ({d['gcn_arch_name']})"
        parts += [_gib(d["memory_bytes"])] if d.get("memory_bytes") else []
        parts += [f"driver {d['driver']}"] if d.get("driver") else []
        text = safe(f"{d['name']}\n" + ", ".join(parts))
        cover = d.get("torch_build_covers") or {}
        if cover.get("covered") is True:
            text += f"\n[green]torch build covers it[/] ({safe(cover['how'])})"
        elif cover.get("covered") is False:
            text += f"\n[red]torch build does not cover it[/]: {safe(cover['detail'])}"
        elif cover.get("how") == "unknown":
            text += f"\ntorch build coverage unknown: {safe(cover['detail'])}"
        text += "".join(f"\n[yellow]note[/]: {safe(note)}" for note in d.get("notes") or ())
        rows.append((label, _Markup(text)))
    return rows


def _triton_rows(t: dict[str, Any]) -> _Rows:
    if not t["installed"]:
        return [("triton", _Markup("[dim]not installed[/]"))]
    dists = ", ".join(
        f"{n} {v['version']} (backends: {', '.join(v['built_for'])})"
        for n, v in t["distributions"].items()
    )
    provider = f"{t['provider']} {t['version']}" if t["provider"] else None
    unknown = f"unknown: {t['provider_evidence'] or 'no distribution metadata'}"
    rows = [
        ("provider", provider or unknown),
        ("installed", dists or "none found"),
        ("location", t["location"] or "?"),
    ]
    if t["backend"]:
        target = f"{t['backend']} {t['arch'] or '(arch n/a)'}"
        target += f", warp size {t['warp_size']}" if t.get("warp_size") else ""
        target += f" (from {t['target_source']})"
        if t.get("target_not_asked"):
            target += f"; the runtime was not asked: {t['target_not_asked']}"
        rows.append(("target", target))
    elif t.get("target_not_asked"):
        rows.append(("target", f"not asked: {t['target_not_asked']}"))
    elif t.get("target_error"):
        rows.append(("target", f"none: {t['target_error']}"))
    if t["conflict"]:
        rows.append(("conflict", _Markup(f"[yellow]{safe(t['conflict'])}[/]")))
    if t["matches_torch_build"] is False:
        mismatch = "[red]the importable triton carries no backend for this torch's GPU runtime[/]"
        rows.append(("mismatch", _Markup(mismatch)))
    if t.get("torch_requires"):
        rows.append(("torch pins", t["torch_requires"]))
    if t.get("torch_pin_problem"):
        rows.append(("risk", _Markup(f"[yellow]{safe(t['torch_pin_problem'])}[/]")))
    return [*rows, ("import", _Markup(_status(t["import"])))]


def _library_rows(libs: dict[str, dict[str, Any]]) -> _Rows:
    rows = []
    for name, lib in libs.items():
        imp = lib["import"]
        if not lib["installed"]:
            why = f": {safe(imp['reason'])}" if lib["distributions"] else ""
            rows.append((name, _Markup(f"[dim]not installed[/]{why}")))
            continue
        text = safe(f"{lib['version'] or '(no distribution metadata)'}")
        text += f", {safe(lib['identified_as'])}" if lib.get("identified_as") else ""
        text += f"\nimport {safe(lib['check_module'])}: {_status(imp)}"
        if imp["status"] != "ok" and imp.get("reason"):
            text += f"\n{safe(imp['reason'])}"
        if imp.get("stdout"):
            text += f"\n[yellow]printed to stdout on import[/]: {safe(imp['stdout'][:200])}"
        rows.append((name, _Markup(f"{text}\n[dim]{safe(lib['location'] or '')}[/]")))
    return rows


def _site_rows(s: dict[str, Any]) -> _Rows:
    rows = [("hostname", s["hostname"]), *s["slurm"].items()]
    rows += [(m["signal"], f"{m['value']} (hint: {m['hint']})") for m in s["markers"]]
    if not s["slurm"] and not s["markers"]:
        rows.append(("markers", _Markup("[dim]no Slurm job, no known site marker[/]")))
    return rows


def render(report: dict[str, Any], console: Any) -> None:
    """The readable report: one small section per part (narrow terminals fold the values)."""
    from rich.table import Table  # rich: not on the job-start path

    sections = [
        ("host", _host_rows(report["host"])),
        ("torch", _torch_rows(report["torch"])),
        ("accelerators", _device_rows(report["accelerators"])),
        ("triton", _triton_rows(report["triton"])),
        ("kernel libraries", _library_rows(report["libraries"])),
        ("site", _site_rows(report["site"])),
    ]
    if report["fingerprint"] is not None:
        empty = _Markup("[dim]''[/]")
        rows = [(k, str(v) if v != "" else empty) for k, v in report["fingerprint"].items()]
        sections.append(("lock fingerprint", rows))
    if report["errors"]:
        errors = [(e["where"], _Markup(f"[red]{safe(e['error'])}[/]")) for e in report["errors"]]
        sections.append(("errors", errors))
    for title, rows in sections:  # keys and plain values are made safe here
        console.print()
        console.rule(f"[bold]{title}[/]", align="left")
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in rows:
            table.add_row(safe(key), value if isinstance(value, _Markup) else safe(value))
        console.print(table)
    checks = report["import_checks"]
    how = "no import checks"
    if checks["run"]:
        how = f"import checks in child processes, {checks['timeout']:.0f} s timeout"
        if checks.get("load_per_core") is not None:
            how += f" (scaled to load {checks['load_per_core']:.1f} per core)"
    console.print()
    for note in checks.get("notes", ()):
        console.print(f"[yellow]note:[/] {safe(note)}", soft_wrap=False)  # wrapped at the width
    console.print(f"[dim]detected in {report['seconds']:.2f} s ({how})[/]", soft_wrap=False)
