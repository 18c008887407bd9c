"""Federated training on Flower (needs `pip install edgetrain[federated]`): a loopback demo, and the app's folder.

`edgetrain federated demo` starts a Flower SuperLink and N SuperNodes on 127.0.0.1 (Flower's Deployment Engine,
no Ray), each node holding a non-IID (Dirichlet-by-label) share of the bundled digits, runs the edgetrain
Flower app for R rounds and prints the global model's test accuracy per round. `edgetrain federated app`
prints the app's folder and the commands that run it on real nodes.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path


def add_arguments(p):
    sub = p.add_subparsers(dest="federated_command", required=True)
    demo = sub.add_parser("demo", help="a loopback federation of N clients on the bundled digits")
    demo.add_argument("--clients", type=int, default=3)
    demo.add_argument("--rounds", type=int, default=5)
    demo.add_argument("--local-epochs", type=int, default=1)
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--lr", type=float, default=0.01, help="the clients' AdamW learning rate (default: 0.01)")
    demo.add_argument("--strategy", choices=("fedavg", "fedprox", "fedadam"), default="fedavg")
    demo.add_argument("--alpha", type=float, default=0.5,
                      help="Dirichlet concentration of the label split; smaller is less IID (default: 0.5)")
    demo.add_argument("--fraction-evaluate", type=float, default=0.0,
                      help="share of nodes that also evaluate each round (default: 0, central evaluation only)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--compare", action="store_true",
                      help="also train centrally on all the training data for rounds x local epochs")
    demo.add_argument("-o", "--output", help="folder for the artifacts, the global checkpoint and the Flower logs "
                                             "(default: a temporary folder, removed at the end)")
    demo.set_defaults(federated_fn=_demo)
    app = sub.add_parser("app", help="print the Flower app's folder and how to run it on the Deployment Engine")
    app.set_defaults(federated_fn=_app)


def run(args) -> int:
    return args.federated_fn(args)


def _app(args) -> int:
    from ..federated import APP_DIR

    print(APP_DIR)
    print(f"""
# on every machine: pip install 'edgetrain[federated]' and copy the training artifacts (edgetrain artifacts ...)
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1     # then each server below in its own terminal
flower-superlink --insecure --disable-runtime-dependency-installation --host 127.0.0.1 --port 9093
flower-supernode --insecure --superlink 127.0.0.1:9093 --port 9094 --node-config 'partition-id=0 num-partitions=2'
flower-supernode --insecure --superlink 127.0.0.1:9093 --port 9095 --node-config 'partition-id=1 num-partitions=2'
mkdir -p "${{FLWR_HOME:-$HOME/.flwr}}" && cat > "${{FLWR_HOME:-$HOME/.flwr}}/config.toml" <<'EOF'
[superlink]
default = "link"
[superlink.link]
address = "127.0.0.1:9093"
insecure = true
EOF
flwr run {APP_DIR} --run-config 'artifacts-dir="/path/to/artifacts" num-server-rounds=5' --format json
flwr list --run-id RUN_ID      # the final status (flwr run's exit code does not say how the run ended)""")
    return 0


def _demo(args) -> int:
    if args.output:
        return _run_demo(args, Path(args.output))
    with tempfile.TemporaryDirectory(prefix="edgetrain-federated-") as folder:
        return _run_demo(args, Path(folder))


def _run_demo(args, folder: Path) -> int:
    from ..errors import InputError
    from ..federated import APP_DIR
    from ..federated.core import make_digits_artifacts, read_history
    from ..federated.loopback import Federation, require_flower

    if args.clients < 1 or args.rounds < 1:
        raise InputError("--clients and --rounds must be >= 1")
    require_flower()
    artifacts = make_digits_artifacts(folder / "artifacts")
    checkpoint = folder / "global_checkpoint"
    nodes = [{"partition-id": i, "num-partitions": args.clients} for i in range(args.clients)]
    config = {"artifacts-dir": str(artifacts), "checkpoint": str(checkpoint), "num-server-rounds": args.rounds,
              "strategy": args.strategy, "local-epochs": args.local_epochs, "batch-size": args.batch_size,
              "learning-rate": args.lr, "fraction-evaluate": args.fraction_evaluate, "min-nodes": args.clients,
              "dirichlet-alpha": args.alpha, "seed": args.seed}
    print(f"edgetrain federated demo: {args.clients} Flower SuperNodes on 127.0.0.1, digits split by label "
          f"(Dirichlet alpha {args.alpha}), {args.strategy}, {args.rounds} rounds of {args.local_epochs} local "
          f"epoch(s); folder {folder}")
    start = time.perf_counter()
    with Federation(folder, nodes) as fed:
        run_id = fed.run(APP_DIR, config)
        status = fed.wait(run_id, timeout=300 + 120 * args.rounds)
    elapsed = time.perf_counter() - start
    history = read_history(checkpoint.with_name(checkpoint.name + ".history.jsonl"))
    for line in history:
        extra = "" if line["round"] == 0 else (f", {line['aggregated']}/{line['sent']} clients averaged, "
                                               f"{line['seconds']:.1f} s, {line['bytes-up'] / 1024:.1f} KiB up")
        dropped = "; dropped: " + "; ".join(line["dropped"]) if line.get("dropped") else ""
        print(f"  round {line['round']}: test accuracy {line['central-accuracy']:.4f}, "
              f"loss {line['central-loss']:.4f}{extra}{dropped}")
    print(f"run {run_id}: {status} in {elapsed:.1f} s; global checkpoint {checkpoint}"
          + ("" if args.output else " (removed at exit: -o DIR keeps it)"))
    if args.compare:
        accuracy = centralized_accuracy(artifacts, args.rounds * args.local_epochs, args.batch_size, args.lr,
                                        args.seed)
        print(f"centralized, same data and {args.rounds * args.local_epochs} epochs: test accuracy {accuracy:.4f}")
    if status != "finished:completed":
        print(f"Flower logs: {folder / 'logs'}" + ("" if args.output else " (use -o DIR to keep them)"))
        return 1
    return 0


def centralized_accuracy(artifacts, epochs: int, batch_size: int, lr: float, seed: int) -> float:
    import numpy as np

    from ..data import digits_split
    from ..trainer import evaluate_metrics, open_artifacts, train_epoch

    (x, y), test = digits_split(seed=seed)
    _, module, optimizer = open_artifacts(artifacts)
    if lr > 0:
        optimizer.set_learning_rate(lr)
    for epoch in range(epochs):
        train_epoch(module, optimizer, [x, y], batch_size, epoch, np.random.default_rng([seed, epoch]))
    return evaluate_metrics(module, list(test), 512)["accuracy"]
