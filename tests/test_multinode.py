"""Several nodes: the torchrun command, the node settings' errors, node 0's sweep protocol (launches posted, rank 0's
record taken from the node that got it, records written once), and two torchrun agents on 127.0.0.1 as two nodes."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from test_runner import make_experiment

from suite.commands.cli import main
from suite.config.errors import ConfigError
from suite.config.launch import Nodes, torchrun_command
from suite.core import launcher as launcher_module
from suite.core import nodes as node_module
from suite.core import registry, runner
from suite.core.experiment import Row
from suite.core.nodes import Coordinator
from suite.core.request import SweepRequest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_command_is_standalone_by_default_and_spans_nodes_when_given_them():
    cmd = torchrun_command(4, "mod", ["a"])
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "mod", "a"]
    nodes = Nodes(nnodes=2, node_rank=1, endpoint="node0:29500", rdzv_id="job").validate()
    assert torchrun_command(4, "mod", ["a"], nodes)[3:] == [
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29500",
        "--rdzv-id=job",
        "--nproc_per_node=2",
        "-m",
        "mod",
        "a",
    ]
    held = torchrun_command(4, "mod", [], nodes, rdzv_id="job-7", store_held=True)
    assert "--rdzv-id=job-7" in held and "--rdzv-conf=is_host=false" in held
    with pytest.raises(ConfigError, match="3 rank.* do not split evenly over --nnodes 2.*--nnodes 1 or 3"):
        torchrun_command(3, "mod", [], nodes)


def test_settings_come_from_the_environment_and_the_command_line_wins():
    env = {"SUITE_NNODES": "2", "SUITE_NODE_RANK": "1", "SUITE_RDZV_ENDPOINT": "h:1", "SUITE_RDZV_ID": "x"}
    assert Nodes.from_env(env) == Nodes(2, 1, "h:1", "x")
    assert Nodes.from_env(env, node_rank=0, endpoint="g:2") == Nodes(2, 0, "g:2", "x")
    assert Nodes.from_env({}) == Nodes()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "table4", "--nnodes", "0"], ["--nnodes 0", "1 (this machine alone"]),
        (["run", "table4", "--nnodes", "2", "--node-rank", "0"], ["needs --rdzv-endpoint HOST:PORT"]),
        (["run", "table4", "--nnodes", "2", "--rdzv-endpoint", "h:1"], ["needs --node-rank", "0 on the machine"]),
        (["run", "table4", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], ["give 0..1"]),
        (["run", "table4", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h"], ["HOST:PORT", "1-65535"]),
        (["run", "table4", "--node-rank", "1"], ["--node-rank applies to several nodes only"]),
        (
            ["run", "table4", "--profile", "tiny", "--nnodes", "3", "--node-rank", "0", "--rdzv-endpoint", "h:1"],
            ["table4/N-ranks-u1: 2 rank(s) do not split evenly over --nnodes 3", "--nnodes 1 or 2"],
        ),
        (["check", "l2l", "--nnodes", "2", "--rdzv-endpoint", "h:1"], ["runs on one rank here", "drop --nnodes"]),
    ],
)
def test_bad_node_settings_get_a_one_line_error(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for w in words:
        assert w in err, err


def test_a_bad_setting_in_the_environment_is_named(monkeypatch, capsys):
    monkeypatch.setenv("SUITE_NNODES", "two")
    assert main(["run", "table4"]) == 2
    assert "--nnodes 'two' (or SUITE_NNODES): give a whole number" in capsys.readouterr().err


def test_node_0_writes_every_record_and_takes_rank_0s_from_the_node_that_got_it(tmp_path, monkeypatch):
    """The protocol with the processes faked: node 1 gets rank 0 of the L2L cell, node 0 of the pipeline's; the
    one-rank cell runs on node 0 alone; both nodes start each launch under the same rendezvous id."""
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")
    exp = make_experiment(
        [
            Row("one", "grad_accum"),
            Row("pipe", "gpipe", {"executor": "dist", "stages": 2}),
            Row("dp", "l2l", {"ranks": 2}),
            Row("bad", "l2l", {"ranks": 2, "seed": 1}),
        ]
    )
    calls = []

    def fake_launch(payload, world, timeout, nodes=None, rdzv_id=None):
        node = nodes.node_rank if nodes is not None else 0
        calls.append((node, payload["row"], world, rdzv_id))
        if node == {"one": 0, "pipe": 0, "dp": 1}.get(payload["row"]):  # rank 0 landed here (on no node for "bad")
            return {"status": "ok", "metrics": {"throughput": 10.0 + node}, "provenance": {"node": node}}, {}
        code = 1 if payload["row"] == "bad" else 0  # "bad": rank 0 died without a record, on node 0
        failure = f"error: cell process exited with code {code} without a record"
        return None, {"status": failure, "metrics": {}, "error": "", "provenance": None}

    for module in (launcher_module, node_module):  # a single-rank cell's launch, a multi-rank one's on each node
        monkeypatch.setattr(module, "launch", fake_launch)
    registry.load_all()  # here, not in two threads at once
    endpoint = f"127.0.0.1:{free_port()}"
    out = {}

    def node(rank):
        nodes = Nodes(2, rank, endpoint).validate()
        out[rank] = runner.run_cells(
            SweepRequest(exp, "tiny", results_dir=tmp_path / f"node{rank}", wandb_mode="off", nodes=nodes),
            progress=lambda m: None,
        )

    follower = threading.Thread(target=node, args=(1,))
    follower.start()
    node(0)
    follower.join(60)
    assert not follower.is_alive()

    records = [r for _, r in out[0]]
    got = {r["row"]: r for r in records}
    assert [got[n]["status"] for n in ("one", "pipe", "dp")] == ["ok", "ok", "ok"]
    assert got["bad"]["status"] == "error: cell process exited with code 1 without a record"
    assert got["pipe"]["rank0_node"] == 0 and got["pipe"]["metrics"]["throughput_rounds"] == [10.0] * 3
    assert got["dp"]["rank0_node"] == 1 and got["dp"]["provenance"] == {"node": 1}
    assert "rank0_node" not in got["one"]
    assert all(r["variant"] == "nnodes=2" and r["config"]["nnodes"] == 2 for r in records)
    assert len(list((tmp_path / "node0" / "runs" / "test-machine").glob("*.json"))) == 4
    assert out[1] == [] and not (tmp_path / "node1").exists()
    # 3 rounds of the multi-rank cells on both nodes (the failed one's first only), each launch under one
    # rendezvous id; the one-rank cell's 3 rounds on node 0 alone
    assert sorted(c[1] for c in calls if c[0] == 1) == ["bad"] + ["dp"] * 3 + ["pipe"] * 3
    for row in ("pipe", "dp"):
        ids = [[c[3] for c in calls if c[0] == n and c[1] == row] for n in (0, 1)]
        assert ids[0] == ids[1] and len(set(ids[0])) == 3
    assert [c[2:] for c in calls if c[1] == "one"] == [(1, None)] * 3


def test_one_node_0_per_endpoint_and_one_node_per_rank():
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [Nodes(2, r, endpoint).validate() for r in (0, 1)]
    host = Coordinator.host(nodes[0])
    with pytest.raises(ConfigError, match="node 0 cannot listen at --rdzv-endpoint 127.0.0.1:.*give a free port"):
        Coordinator.host(nodes[0])
    Coordinator.join(nodes[1])
    with pytest.raises(ConfigError, match="another node already joined .* as --node-rank 1"):
        Coordinator.join(nodes[1])
    host.finish(wait=False)


def _run_nodes(tmp_path, timeout: float = 300) -> dict[int, str]:
    """`suite run` of tests/multinode_sweep.py as node 1 and node 0 on this machine; their outputs by node."""
    endpoint = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, TESTS, os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",  # two "machines" share this one's cores
        "SUITE_MACHINE": "test-machine",
    }
    procs = {}
    for rank in (1, 0):
        cmd = [sys.executable, os.path.join(TESTS, "multinode_sweep.py"), "--nnodes", "2", "--node-rank", str(rank)]
        procs[rank] = subprocess.Popen(
            [*cmd, "--rdzv-endpoint", endpoint],
            env={**env, "SUITE_RESULTS_DIR": str(tmp_path / f"node{rank}")},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    outs, deadline = {}, time.monotonic() + timeout
    try:
        for rank, proc in procs.items():
            outs[rank] = proc.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two nodes did not finish within {timeout} s (hang?)")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    for rank, proc in procs.items():
        assert proc.returncode == 0, f"node {rank}:\n{outs[rank][-4000:]}"
    return outs


@pytest.mark.slow  # make test-slow: make test stays inside its 15 minutes on a 2-core machine
def test_two_agents_on_this_machine_as_two_nodes_run_a_pipeline_and_an_l2l_cell(tmp_path):
    outs = _run_nodes(tmp_path)
    assert "following node 0" in outs[1] and "node 0 ended the sweep" in outs[1]
    assert not (tmp_path / "node1" / "runs").exists()  # node 1 writes no record
    paths = sorted((tmp_path / "node0" / "runs" / "test-machine").glob("*.json"))
    records = {r["row"]: r for r in (json.loads(p.read_text()) for p in paths)}
    assert len(paths) == 2 and set(records) == {"gpipe", "l2l"}, outs[0]
    for rec in records.values():
        assert rec["status"] == "ok", rec.get("error")
        assert rec["variant"] == "nnodes=2" and rec["config"]["nnodes"] == 2 and rec["rank0_node"] in (0, 1)
        m = rec["metrics"]
        assert m["throughput"] > 0 and m["step_time_median"] > 0
        assert len(m["rank_memory"]) == 2 and min(m["rank_memory"]) > 0  # both ranks answered the gather
    # The pipeline's two stages hold different layers; L2L's two data-parallel replicas hold the same.
    pipe, dp = records["gpipe"]["metrics"], records["l2l"]["metrics"]
    assert pipe["rank_memory"][0] != pipe["rank_memory"][1]
    assert dp["rank_memory"][0] == dp["rank_memory"][1]
    assert dp["throughput"] == pytest.approx(2 * dp["throughput_per_rank"])  # each rank timed its half
    assert (
        "## tiny profile on test-machine (cpu device), nnodes=2" in (tmp_path / "node0" / "runner-test.md").read_text()
    )


@pytest.mark.slow
def test_the_pipeline_equivalence_check_across_two_nodes_is_bitwise():
    endpoint = f"127.0.0.1:{free_port()}"
    model = ["model.layers=2", "model.hidden=32", "model.heads=2", "model.intermediate=64", "seq_len=8"]
    sets = [x for s in ["executor=dist", "stages=2", *model] for x in ("--set", s)]
    cmd = [sys.executable, "-m", "suite", "check", "gpipe", "--steps", "2", *sets, "--nnodes", "2"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [*cmd, "--rdzv-endpoint", endpoint],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert "PASS: largest 0.000e+00" in "".join(outs)  # one rank per stage: the reference's bits
