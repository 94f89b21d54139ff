"""A third-party plug-in exposing candidates through the kernel_probe.probe.candidates entry-point
group."""

from kernel_probe.candidates import Candidate


def candidates():
    return [
        Candidate(
            "plugin.layer_norm",
            ("LayerNorm",),
            "layer_norm",
            "kp_zoo.norms.GoodLayerNorm",
            kwargs={"eps": "$eps"},
            module="kp_zoo",
            twin_target="torch.nn.LayerNorm",
            twin_kwargs={"eps": "$eps"},
        )
    ]


def broken():
    raise RuntimeError("this plug-in is broken")
