"""The environment fingerprint: which facts a lock pins, and how this machine's are read and
compared.

The one place that computes the fingerprint; ``kernel_probe``'s detection reuses it, so the probe
and the runtime can never disagree about what "this machine" is. Reading it stays cheap: no kernel
library is imported (versions come from package metadata), and on NVIDIA the device facts come from
NVML when it is installed, so no CUDA context is created just to check a lock.

- ``fields``: the catalogue of facts (``FIELDS``), their match rules, and the comparison with a
  lock;
- ``host``: the CPU (archspec, /proc/cpuinfo), the GPU driver's version file, ROCm arch names;
- ``visible``: which devices the visibility variables (``CUDA_VISIBLE_DEVICES``, ``ROCR_...``,
  ``HIP_...``) leave;
- ``nvml``: NVIDIA's devices through NVML, without a CUDA context;
- ``with_torch``: the facts as an imported torch reports them (``current``, ``device_facts``);
- ``version_file``: torch's build read from its installed ``torch/version.py``, never executed;
- ``torchless``: the same facts as ``with_torch`` without importing torch, or which of them need it;
- ``here``: the one a check takes (torch's where it is imported already, else the torch-free read).

No module here imports this package's face: ``import kernel_lock.fingerprint`` runs nothing.
"""

__all__ = [
    "fields",
    "here",
    "host",
    "nvml",
    "torchless",
    "version_file",
    "visible",
    "with_torch",
]
