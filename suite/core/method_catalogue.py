"""The built-in methods by name and the module that registers each, imported only when a name is first asked for.

A list of names, not code a cell runs: suite.core.cell_code leaves this file out of every cell's code, since what a
line decides (the module of a cell's method) is in that cell's code already. So a line added here for a new method
stales no other method's records. A method file added to baselines/ or methods/ without a line here still works: a
name no one lists makes the registry import the module that registers it (suite.core.registry).
"""

from __future__ import annotations

from suite.core.catalogue import Catalogue, Entry

METHODS = Catalogue(
    "method",
    [
        (name, Entry(module))
        for module, names in (
            ("baselines.grad_accum", ("grad_accum",)),
            ("baselines.amp", ("amp",)),
            ("methods.l2l.method", ("l2l", "l2l-cmp")),
            ("methods.gpipe", ("gpipe",)),
            ("methods.pipedream_flush", ("pipedream-flush",)),
            ("methods.pipedream_2bw", ("pipedream-2bw",)),
            ("methods.pipedream_2bw_reference", ("2bw-reference",)),
            ("methods.peers.fsdp", ("fsdp-offload",)),
            ("methods.peers.deepspeed_offload", ("deepspeed-offload", "deepspeed-infinity")),
            (
                "methods.peers.torch_pipelining",
                (
                    "torch-gpipe",
                    "torch-1f1b",
                    "torch-interleaved-1f1b",
                    "torch-looped-bfs",
                    "torch-zero-bubble",
                    "torch-zbv",
                    "torch-dualpipev",
                ),
            ),  # fmt: skip
        )
        for name in names
    ],
)
