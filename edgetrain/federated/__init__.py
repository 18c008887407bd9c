"""Federated training on Flower (``pip install edgetrain[federated]``): edgetrain trains on each node, Flower
moves the parameters and runs the strategy.

- ``core``: partitions, a node's local training, the global model and its checkpoint (numpy and edgetrain only);
- ``apps``: Flower's ``clientapp`` and ``serverapp`` (imports ``flwr``);
- ``loopback``: a SuperLink and N SuperNodes as processes on 127.0.0.1, and ``flwr run`` (the CLI's demo).

``import edgetrain`` imports none of these.
"""
from pathlib import Path

APP_DIR = Path(__file__).with_name("app")     # the Flower app (pyproject.toml with [tool.flwr.app])
