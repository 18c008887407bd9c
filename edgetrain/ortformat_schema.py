"""Field numbers of ONNX Runtime's ORT-format model schema (``ort.fbs``, file identifier ``ORTM``), as ORT 1.19
compiles it, shared by the writer (``ortformat_writer``) and the reader (``ortformat``).

A field's number is its position in its table; a union field takes two numbers (its type byte, then its
value). ORT 1.19 writes and accepts only ORT-format model version "6".
"""
from __future__ import annotations

FILE_IDENTIFIER = b"ORTM"
ORT_MODEL_VERSION = "6"


class InferenceSession:
    ort_version, model, session_state, kernel_type_str_resolver = range(4)


class Model:
    (ir_version, opset_import, producer_name, producer_version, domain, model_version, doc_string, graph,
     graph_doc_string, metadata_props) = range(10)


class Graph:
    (initializers, node_args, nodes, max_node_index, node_edges, inputs, outputs, sparse_initializers,
     runtime_optimizations) = range(9)


class Node:
    (name, doc_string, domain, since_version, index, op_type, type, execution_provider_type, inputs, outputs,
     attributes, input_arg_counts, implicit_inputs) = range(13)


class NodeEdge:
    node_index, input_edges, output_edges = range(3)


EDGE_END_SIZE = 12      # struct EdgeEnd {node_index: uint32; src_arg_index: int32; dst_arg_index: int32}


class ValueInfo:
    name, doc_string, type = range(3)


class TypeInfo:
    denotation, value_type, value = range(3)


class TypeInfoValue:        # the union's type byte
    NONE, tensor_type, sequence_type, map_type = range(4)


class TensorTypeAndShape:
    elem_type, shape = range(2)


class SequenceType:
    elem_type = 0


class Shape:
    dim = 0


class Dimension:
    value, denotation = range(2)


class DimensionValue:
    dim_type, dim_value, dim_param = range(3)
    UNKNOWN, VALUE, PARAM = range(3)


class OperatorSetId:
    domain, version = range(2)


class Tensor:
    name, doc_string, dims, data_type, raw_data, string_data, external_data_offset = range(7)
    EXTERNAL_DATA_OFFSET_DEFAULT = -1     # -1: the data are inline


class Attribute:
    name, doc_string, type, f, i, s, t, g, floats, ints, strings, tensors, graphs = range(13)


# AttributeType (= onnx.AttributeProto.AttributeType)
ATTR_FLOAT, ATTR_INT, ATTR_STRING, ATTR_TENSOR, ATTR_GRAPH, ATTR_FLOATS, ATTR_INTS, ATTR_STRINGS, \
    ATTR_TENSORS, ATTR_GRAPHS = range(1, 11)


class StringStringEntry:
    key, value = range(2)


class KernelTypeStrResolver:
    op_kernel_type_str_args = 0


class OpIdKernelTypeStrArgsEntry:
    op_id, kernel_type_str_args = range(2)


class KernelTypeStrArgsEntry:
    kernel_type_str, args = range(2)


class ArgTypeAndIndex:
    arg_type, index = range(2)
    INPUT, OUTPUT = range(2)
