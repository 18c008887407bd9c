"""The Flower apps: ``clientapp`` trains an edgetrain Module on the node's data, ``serverapp`` runs the rounds.

Imported only by Flower's processes (``[tool.flwr.app.components]`` of ``edgetrain/federated/app/pyproject.toml``)
and by tests; ``import edgetrain`` never imports this (nor Flower).

Settings come from the run config (the app's ``[tool.flwr.app.config]``, ``flwr run --run-config``); a node's
``--node-config`` overrides ``artifacts-dir``, ``data``, ``partition-id`` and ``num-partitions`` for that node.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import psutil
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAdam, FedAvg, FedProx

from ..errors import InputError
from .core import (
    PARAMETERS_KEY,
    GlobalModel,
    LocalNode,
    append_history,
    check_parameters,
    digits_partition,
    load_npz,
)

log = logging.getLogger("flwr.edgetrain")     # under Flower's logger: its handlers stream it to `flwr log`
WEIGHT_KEY = "num-examples"
NODE_KEYS = ("artifacts-dir", "data", "partition-id", "num-partitions")

DEFAULTS = {                      # the app's run config; pyproject.toml repeats these for `flwr run`
    "artifacts-dir": "", "checkpoint": "", "resume": True, "num-server-rounds": 3, "strategy": "fedavg",
    "local-epochs": 1, "batch-size": 32, "learning-rate": 0.0, "proximal-mu": 0.01, "server-lr": 0.01,
    "fraction-train": 1.0, "fraction-evaluate": 0.0, "min-nodes": 2, "min-available-nodes": 0, "round-timeout": 120.0, "straggler-grace": 30.0,
    "dp-clipping-norm": 0.0, "dp-noise-multiplier": 0.0, "central-eval": "digits", "data": "digits", "partition-id": 0, "num-partitions": 1, "dirichlet-alpha": 0.5,
    "seed": 0,
}


def setting(context: Context, key: str):
    if key in NODE_KEYS and key in context.node_config:
        return context.node_config[key]
    return context.run_config.get(key, DEFAULTS[key])


# -- client ---------------------------------------------------------------------------------------------------
def open_node(context: Context) -> LocalNode:
    """This node's artifacts and data: the bundled digits partitioned by ``partition-id`` / ``num-partitions``
    (Dirichlet over labels), or an ``.npz`` named by ``data`` with one array per model input."""
    folder = setting(context, "artifacts-dir")
    if not folder:
        raise InputError("the run config has no artifacts-dir (the folder of the training artifacts on the node)")
    data = setting(context, "data")
    if data == "digits":
        train, test = digits_partition(int(setting(context, "partition-id")), int(setting(context, "num-partitions")),
                                       float(setting(context, "dirichlet-alpha")), int(setting(context, "seed")))
        return LocalNode(folder, train, test)
    node = LocalNode(folder, [])
    node.train_arrays = load_npz(data, node.module.input_names())
    node.test_arrays = node.train_arrays          # federated evaluation of an .npz node: on its own data
    return node


def received(content: RecordDict, size: int, dtype) -> np.ndarray:
    """The flat parameter buffer of a message, checked before it is decoded past its header and before it
    touches a module: a reason (InputError) otherwise."""
    records = list(content.array_records.values())
    if len(records) != 1 or list(records[0].keys()) != [PARAMETERS_KEY]:
        raise InputError(f"expected one ArrayRecord holding the array '{PARAMETERS_KEY}', got "
                         f"{[list(r.keys()) for r in records]}")
    array = records[0][PARAMETERS_KEY]
    if array.dtype != np.dtype(dtype).name or list(array.shape) != [size]:
        raise InputError(f"declared {array.dtype}{list(array.shape)}, expected {np.dtype(dtype).name}[{size}]")
    if len(array.data) > size * np.dtype(dtype).itemsize + 4096:      # .npy header is < 4 KiB
        raise InputError(f"{len(array.data)} bytes for {size} values")
    values = array.numpy()
    reason = check_parameters(values, size, np.dtype(dtype))
    if reason is not None:
        raise InputError(reason)
    return values


def parameters_record(values: np.ndarray) -> ArrayRecord:
    return ArrayRecord({PARAMETERS_KEY: Array(np.ascontiguousarray(values))})


def dp_clipping(msg: Message, context: Context, call_next) -> Message:
    """Flower's client-side fixed clipping (the update's L2 norm clipped to the server's ``clipping_norm``) for
    the rounds of a server that asks for it (``dp-clipping-norm`` > 0); other messages pass untouched, so one
    ClientApp serves runs with and without differential privacy."""
    configs = list(msg.content.config_records.values()) if msg.has_content() else []
    if msg.metadata.message_type == "train" and configs and CLIPPING_NORM in configs[0]:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


CLIPPING_NORM = "clipping_norm"      # the key Flower's DifferentialPrivacyClientSide* strategies send
clientapp = ClientApp(mods=[dp_clipping])


@clientapp.train()
def client_train(msg: Message, context: Context) -> Message:
    entered = time.time()
    node = open_node(context)
    opened = time.time()
    config = msg.content.config_records.get("config", ConfigRecord())
    result = node.train(received(msg.content, node.size, node.dtype),
                        epochs=int(setting(context, "local-epochs")), batch_size=int(setting(context, "batch-size")),
                        learning_rate=float(setting(context, "learning-rate")), seed=int(setting(context, "seed")),
                        server_round=int(config.get("server-round", 0)),
                        node_seed=int(setting(context, "partition-id")),
                        proximal_mu=float(config.get("proximal-mu", 0.0)))
    # where a round's time goes on the node: this process's start-up (Flower starts one per message) and imports,
    # opening the artifacts (load, plan, kernels from the cache), training
    metrics = {WEIGHT_KEY: result.num_examples, "train-loss": result.loss,
               "client-seconds-startup": entered - psutil.Process().create_time(),
               "client-seconds-open": opened - entered, "client-seconds-train": time.time() - opened,
               "client-rss-mb": psutil.Process().memory_info().rss / 2**20}
    metrics.update({f"local-{k}": float(v) for k, v in result.metrics.items() if k != "samples"})
    return Message(RecordDict({"arrays": parameters_record(result.parameters), "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


@clientapp.evaluate()
def client_evaluate(msg: Message, context: Context) -> Message:
    node = open_node(context)
    metrics = node.evaluate(received(msg.content, node.size, node.dtype), int(setting(context, "batch-size")))
    out = {WEIGHT_KEY: int(metrics.pop("samples"))}
    out.update({f"eval-{k}": float(v) for k, v in metrics.items()})
    return Message(RecordDict({"metrics": MetricRecord(out)}), reply_to=msg)


# -- server ---------------------------------------------------------------------------------------------------
def make_strategy(config: dict):
    """FedAvg (default), FedProx or FedAdam from the run config; all weigh replies by ``num-examples``."""
    nodes = int(config["min-nodes"])
    available = max(nodes, int(config["min-available-nodes"]))     # rounds start once this many are connected
    common = {"fraction_train": float(config["fraction-train"]),
              "fraction_evaluate": float(config["fraction-evaluate"]), "min_train_nodes": nodes,
              "min_evaluate_nodes": nodes, "min_available_nodes": available, "weighted_by_key": WEIGHT_KEY}
    table = {
        "fedavg": lambda: FedAvg(**common),
        "fedprox": lambda: FedProx(**common, proximal_mu=float(config["proximal-mu"])),
        "fedadam": lambda: FedAdam(**common, eta=float(config["server-lr"]), beta_1=0.9, beta_2=0.99),
    }
    name = str(config["strategy"]).lower()
    if name not in table:
        raise InputError(f"strategy '{config['strategy']}' is not supported; supported: {', '.join(sorted(table))}")
    strategy = table[name]()
    clip = float(config["dp-clipping-norm"])
    if clip > 0:        # client-side clipping (the dp_clipping mod), Gaussian noise added to the aggregate here
        strategy = DifferentialPrivacyClientSideFixedClipping(strategy, float(config["dp-noise-multiplier"]), clip,
                                                              num_sampled_clients=nodes)
    return strategy


def inner(strategy):
    """The strategy a DP wrapper wraps (its sampling and record keys), or the strategy itself."""
    return getattr(strategy, "strategy", strategy)


def screen_replies(replies: list[Message], size: int, dtype) -> tuple[list[Message], list[tuple[int, str]]]:
    """Replies fit to average, and (node id, reason) for each one dropped: an error reply, a missing or
    non-positive weight, or parameters of the wrong dtype or size or with NaN/inf. A dropped reply is logged
    and never reaches the strategy."""
    good, dropped = [], []
    for msg in replies:
        node = msg.metadata.src_node_id
        try:
            if msg.has_error():
                raise InputError(f"error reply: {msg.error.reason}")
            metrics = list(msg.content.metric_records.values())
            weight = metrics[0].get(WEIGHT_KEY) if len(metrics) == 1 else None
            if not isinstance(weight, (int, float)) or not np.isfinite(weight) or weight <= 0:
                raise InputError(f"no positive '{WEIGHT_KEY}' in one MetricRecord")
            received(msg.content, size, dtype)
        except (InputError, ValueError, TypeError, KeyError) as e:
            log.warning("round reply from node %s dropped: %s", node, e)
            dropped.append((node, str(e)))
            continue
        good.append(msg)
    return good, dropped


def collect(grid: Grid, messages: list[Message], timeout: float, quorum: int, grace: float,
            poll: float = 0.25) -> list[Message]:
    """Send ``messages`` and gather replies until all are in, ``timeout`` seconds have passed, or ``grace`` seconds
    after ``quorum`` replies arrived (a killed or stalled node holds the round only that long; Flower reports
    a lost node only after missed heartbeats, a minute or more). Polls every ``poll`` s: ``Grid.send_and_receive``
    polls every 3 s, which would be most of a round on loopback."""
    pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    start = time.monotonic()
    quorum_at = None
    while pending and time.monotonic() - start < timeout:
        got = list(grid.pull_messages(pending))
        replies += got
        pending -= {m.metadata.reply_to_message_id for m in got}
        if quorum_at is None and len(replies) >= quorum:
            quorum_at = time.monotonic()
        if not pending or (quorum_at is not None and time.monotonic() - quorum_at >= grace):
            break
        time.sleep(poll)
    if pending:
        log.warning("%d of %d node(s) did not reply in time; the round goes on without them", len(pending),
                    len(messages))
    return replies


def run_server(grid: Grid, config: dict) -> list[dict]:
    """The rounds from the global checkpoint's next one to ``num-server-rounds``: train (and evaluate) on the
    nodes, drop bad replies, aggregate with the strategy, evaluate centrally, write the checkpoint atomically and a
    line of ``history.jsonl`` beside it. Returns this run's history lines."""
    config = {**DEFAULTS, **config}
    folder = config["artifacts-dir"]
    if not folder:
        raise InputError("the run config has no artifacts-dir (the folder of the training artifacts)")
    checkpoint = Path(config["checkpoint"] or Path(folder) / "federated" / "global_checkpoint")
    history_path = checkpoint.with_name(checkpoint.name + ".history.jsonl")
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    model = GlobalModel(folder, checkpoint, resume=bool(config["resume"]))
    strategy = make_strategy(config)
    central = None
    if config["central-eval"] == "digits":
        from ..data import digits_split
        central = list(digits_split(seed=int(config["seed"]))[1])
    elif config["central-eval"]:
        central = load_npz(config["central-eval"], model.module.input_names())
    timeout, grace = float(config["round-timeout"]), float(config["straggler-grace"])
    lines = []
    if model.round == 0 and central is not None:
        lines.append({"round": 0, **{f"central-{k}": v for k, v in model.evaluate(central).items()}})
        append_history(history_path, lines[-1])
    log.info("global model from %s, round %d; rounds %d..%d", checkpoint if model.round else folder, model.round,
             model.round + 1, int(config["num-server-rounds"]))
    for rnd in range(model.round + 1, int(config["num-server-rounds"]) + 1):
        t0 = time.perf_counter()
        arrays = parameters_record(model.parameters())
        sent = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))
        replies = collect(grid, sent, timeout, inner(strategy).min_train_nodes, grace)
        t_train = time.perf_counter() - t0
        good, dropped = screen_replies(replies, model.size, model.dtype)
        line = {"round": rnd, "sent": len(sent), "replies": len(replies), "aggregated": len(good),
                "dropped": [f"node {n}: {r}" for n, r in dropped],
                "bytes-down": sum(len(m.content[inner(strategy).arrayrecord_key][PARAMETERS_KEY].data) for m in sent),
                "bytes-up": sum(len(r.content.array_records[k][PARAMETERS_KEY].data) for r in good
                                for k in r.content.array_records)}
        aggregated, train_metrics = strategy.aggregate_train(rnd, good) if good else (None, None)
        try:
            if aggregated is None:
                raise InputError("no reply fit to average")
            model.update(np.asarray(aggregated[PARAMETERS_KEY].numpy(), dtype=model.dtype))
        except InputError as e:          # e.g. a server optimizer (FedAdam) that diverged to inf
            log.warning("round %d: %s; the global model is unchanged", rnd, e)
            line["not-updated"] = str(e)
        line.update({k: float(v) for k, v in (train_metrics or {}).items()})
        t1 = time.perf_counter()
        if inner(strategy).fraction_evaluate > 0:
            asked = list(strategy.configure_evaluate(rnd, parameters_record(model.parameters()), ConfigRecord(), grid))
            answers = [m for m in collect(grid, asked, timeout, inner(strategy).min_evaluate_nodes, grace)
                       if not m.has_error()]
            fed = strategy.aggregate_evaluate(rnd, answers) if answers else None
            line.update({f"federated-{k}": float(v) for k, v in (fed or {}).items()})
        if central is not None:
            line.update({f"central-{k}": v for k, v in model.evaluate(central).items()})
        t2 = time.perf_counter()
        model.save(rnd)
        line.update({"seconds-train": t_train, "seconds-evaluate": t2 - t1, "seconds": time.perf_counter() - t0})
        append_history(history_path, line)
        lines.append(line)
        log.info("round %d: %s", rnd, line)
    return lines


serverapp = ServerApp()


@serverapp.main()
def server_main(grid: Grid, context: Context) -> None:
    run_server(grid, dict(context.run_config))
