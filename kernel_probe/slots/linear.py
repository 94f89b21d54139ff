"""The Linear slot in the probe: the protocol's defaults, plus the BLAS library it ran under (a
lock key) and, on a CPU, whether the regime's matmuls are emulated here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernel_lock.model import Site
from kernel_lock.slots import linear

from .base import Slot

if TYPE_CHECKING:
    from kernel_probe.probe.report import Report

__all__ = ["LINEAR"]


class Linear(Slot):
    """torch.nn.Linear's slot."""

    shape_form = "ROWSxINxOUT"

    def lock_keys(
        self, values: Mapping[str, Any], kwargs: Mapping[str, Any], report: Report
    ) -> dict[str, Any]:
        """On a GPU: the BLAS library the chosen candidate was checked and timed under."""
        if not report.blas:
            return {}
        return {"blas": linear.Blas(library=report.blas, build_default=report.blas_default)}

    def site_shape(self, site: Site) -> tuple[str, int]:
        """ROWSxINxOUT: the input's rows and width, and the site's ``out_features``."""
        shape, per = super().site_shape(site)
        return f"{shape}x{int(site.semantics['out_features'])}", per

    def warnings(self, device: str, dtype: str) -> list[str]:
        """A CPU whose regime's matmuls are emulated: the probe will be slow."""
        if device != "cpu" or dtype == "float32":
            return []
        from kernel_probe.detect import host  # reads the CPU's flags: only for this warning

        warning = host.emulated_warning(dtype)
        return [warning] if warning else []

    def notes(self, device: str, dtype: str, timings: Mapping[str, Sequence[Any]]) -> list[str]:
        """How long one emulated call took, per timed candidate and shape."""
        if not self.warnings(device, dtype):
            return []
        return [
            f"{dtype} matmul emulated: one forward+backward of {cid} at {row['shape']} took "
            f"{row['median_ms'] / 1000:.2f} s"
            for cid, rows in timings.items()
            for row in rows
            if "median_ms" in row
        ]

    def evidence(self, report: Report) -> Callable[[str], dict[str, Any]]:
        """On a CPU: whether each dtype's matmul is native or emulated here."""
        if report.device != "cpu":
            return lambda dtype: {}
        from kernel_probe.detect import host  # the CPU's flags: only when a lock is written

        matmul = host.matmul()
        return lambda dtype: {"matmul": host.describe(matmul[dtype])} if dtype in matmul else {}


LINEAR = Linear(linear.LINEAR)
