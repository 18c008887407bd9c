"""Federated training on Flower (edgetrain.federated).

Oracle: a plain numpy FedAvg written here (the example-weighted mean of the clients' parameter buffers), fed by
clients trained in this process with edgetrain.api; Flower's own aggregation, transport and processes are what is
checked against it. In-process tests drive the ServerApp's loop through a stand-in Grid that calls the ClientApp
functions directly; the native tests run a real loopback federation (flower-superlink + flower-supernodes).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from edgetrain.federated.core import (
    ROUND_PROPERTY,
    GlobalModel,
    LocalNode,
    check_parameters,
    digits_partition,
    dirichlet_partition,
    make_digits_artifacts,
    read_history,
)

ROUNDS, NODES, EPOCHS, LR = 2, 3, 1, 0.01


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return make_digits_artifacts(tmp_path_factory.mktemp("fed") / "artifacts")


def test_dirichlet_partition_is_disjoint_complete_and_label_skewed():
    labels = np.random.default_rng(1).integers(0, 10, 2000)
    parts = dirichlet_partition(labels, 4, 0.3, seed=7)
    together = np.concatenate(parts)
    assert len(together) == len(labels) and len(np.unique(together)) == len(labels)      # disjoint, complete
    assert all(len(p) > 0 for p in parts)
    assert all(np.array_equal(a, b) for a, b in zip(parts, dirichlet_partition(labels, 4, 0.3, seed=7)))
    # non-IID: a node's label histogram is far from the global one (an IID split would be within a few %)
    hist = np.stack([np.bincount(labels[p], minlength=10) / len(p) for p in parts])
    assert np.abs(hist - np.bincount(labels, minlength=10) / len(labels)).max() > 0.2


def test_check_parameters_names_what_is_wrong():
    good = np.zeros(5, np.float32)
    assert check_parameters(good, 5, np.float32) is None
    assert "dtype float64" in check_parameters(good.astype(np.float64), 5, np.float32)
    assert "shape [4]" in check_parameters(good[:4], 5, np.float32)
    bad = good.copy()
    bad[2] = np.nan
    assert "1 non-finite" in check_parameters(bad, 5, np.float32)


def numpy_fedavg(artifacts, start: np.ndarray, rounds: range, nodes: int, seed: int = 0) -> np.ndarray:
    """The oracle: each round, every client trains from the global buffer; the new global buffer is the mean of
    theirs weighted by their sample counts."""
    glob = start
    for rnd in rounds:
        updates, weights = [], []
        for pid in range(nodes):
            train, test = digits_partition(pid, nodes, 0.5, seed)
            out = LocalNode(artifacts, train, test).train(glob, EPOCHS, 32, LR, seed, rnd, pid)
            updates.append(out.parameters.astype(np.float64))
            weights.append(out.num_examples)
        glob = (np.tensordot(np.asarray(weights, np.float64) / sum(weights), np.stack(updates), 1)).astype(np.float32)
    return glob


def initial_parameters(artifacts) -> np.ndarray:
    return LocalNode(artifacts, []).module.get_contiguous_parameters(trainable_only=True).numpy().copy()


# -- in process: the ServerApp loop and the ClientApp functions, without Flower's processes -------------------
@pytest.fixture
def flower():
    pytest.importorskip("flwr", reason="Flower is not installed (pip install edgetrain[federated])")
    from flwr.supercore.task_identity import TaskIdentity

    from edgetrain.federated import apps
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1       # what a ServerApp process has
    return apps


class LocalGrid:
    """A Grid that answers each message by calling the ClientApp with the context of the node it is addressed to."""

    def __init__(self, apps, artifacts, nodes: int, faults: dict | None = None, node_configs=None):
        from flwr.app import Context, RecordDict

        self.apps, self.faults = apps, faults or {}
        node_configs = node_configs or [{"partition-id": i, "num-partitions": nodes} for i in range(nodes)]
        self.contexts = {100 + i: Context(1, 100 + i, config, RecordDict(),
                                          {"artifacts-dir": str(artifacts), "learning-rate": LR})
                         for i, config in enumerate(node_configs)}

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        self.replies = {}
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg.object_id      # as Flower's Grid.push_messages does
            node = msg.metadata.dst_node_id
            reply = self.apps.clientapp(msg, self.contexts[node])        # Flower's dispatch, with the app's mods
            self.replies[msg.object_id] = self.faults[node](reply) if node in self.faults else reply
        return list(self.replies)

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]


def server_config(artifacts, tmp_path, **more):
    return {"artifacts-dir": str(artifacts), "checkpoint": str(tmp_path / "global"), "num-server-rounds": ROUNDS,
            "min-nodes": 2, "learning-rate": LR, **more}


def test_in_process_rounds_match_numpy_fedavg_and_checkpoint_each_round(flower, artifacts, tmp_path):
    from edgetrain.api import CheckpointState

    lines = flower.run_server(LocalGrid(flower, artifacts, NODES), server_config(artifacts, tmp_path))
    assert [line["round"] for line in lines] == [0, 1, 2] and all(line.get("dropped") == [] for line in lines[1:])
    expected = numpy_fedavg(artifacts, initial_parameters(artifacts), range(1, ROUNDS + 1), NODES)
    saved = GlobalModel(artifacts, tmp_path / "global")
    assert saved.round == ROUNDS
    np.testing.assert_allclose(saved.parameters(), expected, rtol=1e-5, atol=1e-6)
    assert lines[-1]["central-loss"] < lines[0]["central-loss"]
    assert CheckpointState.load_checkpoint(tmp_path / "global").properties[ROUND_PROPERTY] == ROUNDS


def _nan(reply):
    values = reply.content["arrays"]["parameters"].numpy().copy()
    values[::7] = np.nan
    return _with(reply, values)


def _short(reply):
    return _with(reply, reply.content["arrays"]["parameters"].numpy()[:-1].copy())


def _float64(reply):
    return _with(reply, reply.content["arrays"]["parameters"].numpy().astype(np.float64))


def _with(reply, values):
    from flwr.app import Array, ArrayRecord
    reply.content["arrays"] = ArrayRecord({"parameters": Array(values)})
    return reply


def test_garbage_replies_are_dropped_with_a_reason_and_not_averaged(flower, artifacts, tmp_path):
    grid = LocalGrid(flower, artifacts, 5, faults={102: _nan, 103: _short, 104: _float64})
    lines = flower.run_server(grid, server_config(artifacts, tmp_path, **{"num-server-rounds": 1}))
    dropped = dict(reason.split(": ", 1) for reason in lines[1]["dropped"])      # nodes are sampled in any order
    assert lines[1]["aggregated"] == 2 and sorted(dropped) == ["node 102", "node 103", "node 104"]
    assert "non-finite" in dropped["node 102"]
    assert "expected float32[" in dropped["node 103"] and "float32[" in dropped["node 103"]
    assert dropped["node 104"].startswith("declared float64")
    # the average of the two good clients only (partitions 0 and 1 of 5)
    glob, updates, weights = initial_parameters(artifacts), [], []
    for pid in (0, 1):
        train, _ = digits_partition(pid, 5, 0.5, 0)
        out = LocalNode(artifacts, train).train(glob, EPOCHS, 32, LR, 0, 1, pid)
        updates.append(out.parameters)
        weights.append(out.num_examples)
    expected = np.average(np.stack(updates).astype(np.float64), axis=0, weights=weights)
    np.testing.assert_allclose(GlobalModel(artifacts, tmp_path / "global").parameters(), expected, rtol=1e-5,
                               atol=1e-6)


def test_restarted_server_resumes_at_the_next_round(flower, artifacts, tmp_path):
    config = server_config(artifacts, tmp_path / "a")
    flower.run_server(LocalGrid(flower, artifacts, 2), {**config, "num-server-rounds": 1})
    resumed = flower.run_server(LocalGrid(flower, artifacts, 2), {**config, "num-server-rounds": 2})
    assert [line["round"] for line in resumed] == [2]
    assert [line["round"] for line in read_history(tmp_path / "a" / "global.history.jsonl")] == [0, 1, 2]
    straight = flower.run_server(LocalGrid(flower, artifacts, 2), server_config(artifacts, tmp_path / "b"))
    assert [line["round"] for line in straight] == [0, 1, 2]
    np.testing.assert_array_equal(GlobalModel(artifacts, tmp_path / "a" / "global").parameters(),
                                  GlobalModel(artifacts, tmp_path / "b" / "global").parameters())


def test_fedprox_and_fedadam_are_selectable_and_unknown_names_are_refused(flower, artifacts, tmp_path):
    from edgetrain.errors import InputError

    prox = flower.run_server(LocalGrid(flower, artifacts, 2), server_config(
        artifacts, tmp_path / "p", strategy="fedprox", **{"proximal-mu": 1.0, "num-server-rounds": 1}))
    avg = flower.run_server(LocalGrid(flower, artifacts, 2), server_config(
        artifacts, tmp_path / "a", **{"num-server-rounds": 1}))
    adam = flower.run_server(LocalGrid(flower, artifacts, 2), server_config(
        artifacts, tmp_path / "m", strategy="fedadam", **{"num-server-rounds": 1}))
    start = initial_parameters(artifacts)
    moved = {name: np.abs(GlobalModel(artifacts, tmp_path / name / "global").parameters() - start).sum()
             for name in "pam"}
    assert moved["p"] < moved["a"]            # the proximal step holds the clients nearer the global model
    assert moved["m"] != moved["a"] and all(line["aggregated"] == 2 for line in prox[1:] + adam[1:] + avg[1:])
    with pytest.raises(InputError, match="strategy 'fedsgd' is not supported; supported: fedadam, fedavg"):
        flower.make_strategy({**flower.DEFAULTS, "strategy": "fedsgd"})


def test_client_side_dp_clips_each_update_and_the_server_adds_noise(flower, artifacts, tmp_path):
    clip = 0.5
    config = server_config(artifacts, tmp_path / "clip", **{"num-server-rounds": 1, "dp-clipping-norm": clip})
    lines = flower.run_server(LocalGrid(flower, artifacts, 2), config)
    assert lines[1]["aggregated"] == 2
    start = initial_parameters(artifacts)
    updates, weights = [], []
    for pid in (0, 1):
        train, test = digits_partition(pid, 2, 0.5, 0)
        delta = LocalNode(artifacts, train, test).train(start, EPOCHS, 32, LR, 0, 1, pid).parameters - start
        assert np.linalg.norm(delta) > clip                 # the clipping is not vacuous
        updates.append(delta.astype(np.float64) * clip / np.linalg.norm(delta.astype(np.float64)))
        weights.append(len(train[1]))
    expected = start + np.average(np.stack(updates), axis=0, weights=weights)
    np.testing.assert_allclose(GlobalModel(artifacts, tmp_path / "clip" / "global").parameters(), expected,
                               rtol=1e-5, atol=1e-6)
    noisy = {**config, "checkpoint": str(tmp_path / "noise" / "global"), "dp-noise-multiplier": 1.0}
    flower.run_server(LocalGrid(flower, artifacts, 2), noisy)
    noise = GlobalModel(artifacts, tmp_path / "noise" / "global").parameters() - expected
    # Gaussian noise of std noise-multiplier x clipping norm / sampled clients on every parameter
    # (bounds at ~4 standard errors of a 2,410-sample estimate: std error 1.4% of sigma, mean 0.005)
    assert abs(noise.std() - 1.0 * clip / 2) < 0.06 * clip / 2 and abs(noise.mean()) < 0.025


def test_nodes_with_npz_data_train_and_evaluate_federatedly(flower, artifacts, tmp_path):
    from edgetrain.data import digits

    x, y = digits()
    files = []
    for i, rows in enumerate((slice(0, 300), slice(300, 500))):
        files.append(tmp_path / f"node{i}.npz")
        np.savez(files[-1], input=x[rows], labels=y[rows])
    grid = LocalGrid(flower, artifacts, 2, node_configs=[{"data": str(f), "partition-id": i}
                                                         for i, f in enumerate(files)])
    lines = flower.run_server(grid, server_config(artifacts, tmp_path, **{"num-server-rounds": 1,
                                                                          "fraction-evaluate": 1.0}))
    assert lines[1]["aggregated"] == 2
    # federated evaluation: each node's loss on its own data, averaged by sample count
    model = GlobalModel(artifacts, tmp_path / "global")
    losses = [model.evaluate([x[r], y[r]], 32)["loss"] for r in (slice(0, 300), slice(300, 500))]
    assert lines[1]["federated-eval-loss"] == pytest.approx(np.average(losses, weights=[300, 200]), rel=1e-5)


def test_client_refuses_parameters_it_cannot_load(flower, artifacts):
    from flwr.app import Array, ArrayRecord, RecordDict

    from edgetrain.errors import InputError

    node = LocalNode(artifacts, [])
    huge = RecordDict({"arrays": ArrayRecord({"parameters": Array(np.zeros(node.size + 1, np.float32))})})
    with pytest.raises(InputError, match=r"declared float32\[\d+\], expected float32\[\d+\]"):
        flower.received(huge, node.size, node.dtype)


@pytest.mark.native
def test_core_package_and_cli_do_not_import_flower():
    code = ("import sys, contextlib, io, edgetrain, edgetrain.cli as c\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()): c.main(['--help'])\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()): "
            "c.main(['federated', '--help'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flwr', 'grpc')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- a real federation: Flower's Deployment Engine on 127.0.0.1 ----------------------------------------------
@pytest.mark.native
def test_loopback_federation_matches_numpy_fedavg(flower, artifacts, tmp_path):
    from edgetrain.federated import APP_DIR
    from edgetrain.federated.loopback import Federation

    nodes = 2
    config = {"artifacts-dir": str(artifacts), "checkpoint": str(tmp_path / "global"), "num-server-rounds": ROUNDS,
              "min-nodes": nodes, "learning-rate": LR, "round-timeout": 60.0}
    with Federation(tmp_path, [{"partition-id": i, "num-partitions": nodes} for i in range(nodes)]) as fed:
        status = fed.wait(fed.run(APP_DIR, config), timeout=240)
    assert status == "finished:completed", (tmp_path / "logs" / "superlink.log").read_text()[-3000:]
    history = read_history(tmp_path / "global.history.jsonl")
    assert [line["round"] for line in history] == [0, 1, 2], history
    assert all(line["aggregated"] == nodes for line in history[1:]), history
    assert history[-1]["central-loss"] < history[0]["central-loss"]
    expected = numpy_fedavg(artifacts, initial_parameters(artifacts), range(1, ROUNDS + 1), nodes)
    np.testing.assert_allclose(GlobalModel(artifacts, tmp_path / "global").parameters(), expected, rtol=1e-5,
                               atol=1e-6)


def _cmdline(proc) -> str:
    import psutil
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:         # gone, or a zombie, between listing and reading
        return ""


@pytest.mark.native
def test_loopback_client_killed_mid_round_leaves_the_others_to_finish_it(flower, artifacts, tmp_path):
    import psutil

    from edgetrain.federated import APP_DIR
    from edgetrain.federated.loopback import Federation

    # min-nodes 2 of 3: all three are sampled, two replies make a round, a third gets 3 s more
    config = {"artifacts-dir": str(artifacts), "checkpoint": str(tmp_path / "global"), "num-server-rounds": 1,
              "min-nodes": 2, "min-available-nodes": 3, "learning-rate": LR, "straggler-grace": 3.0}
    with Federation(tmp_path, [{"partition-id": i, "num-partitions": 3} for i in range(3)]) as fed:
        run_id = fed.run(APP_DIR, config)
        victim = psutil.Process(fed.procs["supernode-2"].pid)
        deadline = time.monotonic() + 120
        while not any("flwr-clientapp" in _cmdline(c) for c in victim.children(recursive=True)):
            assert time.monotonic() < deadline, "node 2 never started a ClientApp"
            time.sleep(0.05)
        fed.kill_node(2)                    # its ClientApp is training round 1
        status = fed.wait(run_id, timeout=180)
    assert status == "finished:completed"
    line = read_history(tmp_path / "global.history.jsonl")[-1]
    assert line["round"] == 1 and line["sent"] == 3 and line["aggregated"] == 2, json.dumps(line)


def test_app_pyproject_is_a_valid_flower_app_whose_config_matches_the_defaults(flower, capsys):
    import tomllib
    from flwr.common.config import validate_config

    from edgetrain.cli import main
    from edgetrain.federated import APP_DIR

    config = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    ok, errors, _ = validate_config(config, check_module=True, project_dir=APP_DIR)
    assert ok, errors
    assert config["tool"]["flwr"]["app"]["config"] == flower.DEFAULTS
    assert main(["federated", "app"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(APP_DIR)
