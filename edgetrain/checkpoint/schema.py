"""Field numbers, defaults and element types of the checkpoint schema (``ort_training_checkpoint.fbs``).

A field's number is its position in its table; tests/test_checkpoint.py checks these against the .fbs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..ir.dtypes import EXTENDED, ONNX_TO_NUMPY

SCHEMA_PATH = Path(__file__).with_name("ort_training_checkpoint.fbs")
FILE_IDENTIFIER = b"ODTC"
VERSION = 2          # ORT 1.19 loads exactly this version


class Checkpoint:
    version, module_state, optimizer_groups, property_bag = range(4)


class ModuleState:
    requires_grad_params, frozen_params, is_nominal_state, has_external_data = range(4)


class ParameterOptimizerState:
    param_name, momentums = range(2)


class OptimizerGroup:
    group_name, step, initial_learning_rate, optimizer_states = range(4)


class Property:       # IntProperty, FloatProperty and StringProperty
    name, value = range(2)


class PropertyBag:
    ints, floats, strings = range(3)


class Tensor:
    name, doc_string, dims, data_type, raw_data, string_data, external_data_offset = range(7)
    EXTERNAL_DATA_OFFSET_DEFAULT = -1


TABLES = {"Checkpoint": Checkpoint, "ModuleState": ModuleState,
          "ParameterOptimizerState": ParameterOptimizerState, "OptimizerGroup": OptimizerGroup,
          "IntProperty": Property, "FloatProperty": Property,
          "StringProperty": Property, "PropertyBag": PropertyBag, "Tensor": Tensor}

TYPE_NAMES = {0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
              7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64",
              14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ",
              19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ"}

# Element types with a plain numpy dtype (the IR's, less those ml_dtypes adds: bfloat16, float8, int4, ...); not
# STRING or complex: a checkpoint holds training state, which edgetrain keeps in these.
DTYPES: dict[int, np.dtype] = {k: v for k, v in ONNX_TO_NUMPY.items() if k not in EXTENDED}
TYPE_OF: dict[np.dtype, int] = {v: k for k, v in DTYPES.items()}
MAX_NDIM = 32        # numpy 1.x's limit; no parameter comes near it

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def type_name(data_type: int) -> str:
    return f"{data_type} ({TYPE_NAMES.get(data_type, 'unknown')})"


def supported_types() -> str:
    return ", ".join(TYPE_NAMES[t] for t in sorted(DTYPES))
