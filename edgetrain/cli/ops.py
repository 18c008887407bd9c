"""List the ops edgetrain runs: domain, the ONNX definition (since-version) it implements, element types, and
whether it has a gradient rule (can be trained through); then the ops it runs through their ONNX function body
(edgetrain.inline), with the body's ops they need that edgetrain lacks."""
from __future__ import annotations


def add_arguments(p):
    p.add_argument("--domain", help="only this domain (ai.onnx, com.microsoft, ai.edgetrain)")
    p.add_argument("--gradients", action="store_true", help="only ops with a gradient rule")


def run(args) -> int:
    from ..ir.dtypes import ORT_TYPE_NAME
    from ..ops import OP_TABLE

    rows = []
    for (domain, name), op in OP_TABLE.items():
        domain = domain or "ai.onnx"
        if (args.domain and domain != args.domain) or (args.gradients and op.vjp is None):
            continue
        kind = "yes" if op.vjp is not None else ("training op" if domain != "ai.onnx" or name.endswith("Grad")
                                                 else "no")
        types = (", ".join(ORT_TYPE_NAME.get(d, str(d)) for d in op.element_types)
                 if op.type_input is not None else "any")
        rows.append((name, domain, str(op.since), kind, types))
    widths = [max(len(r[k]) for r in rows + [("op", "domain", "since", "gradient", "types")]) for k in range(4)]
    print(f"{'op':{widths[0]}}  {'domain':{widths[1]}}  {'since':{widths[2]}}  {'gradient':{widths[3]}}  types")
    for r in rows:
        print(f"{r[0]:{widths[0]}}  {r[1]:{widths[1]}}  {r[2]:{widths[2]}}  {r[3]:{widths[3]}}  {r[4]}")
    from ..inline import function_ops
    from ..onnx_io import SUPPORTED_ONNX_OPSETS

    bodies = [(op, domain or "ai.onnx", ctx, missing) for domain, op, ctx, missing in function_ops()
              if not args.domain or (domain or "ai.onnx") == args.domain]
    if bodies:
        print("\nops run through their ONNX function body (gradients from the body's ops; the ops the body needs "
              "must be above):")
        width = max(len(b[0]) for b in bodies)
        for op, domain, ctx, missing in bodies:
            how = "function body built for the node's types and attributes" if ctx else "function body"
            lacks = f"; needs {', '.join(missing)} (not supported)" if missing else ""
            print(f"{op:{width}}  {domain}  {how}{lacks}")

    print(f"{len(rows)} ops, {len(bodies)} more through their function body; models load at ai.onnx opsets "
          f"{SUPPORTED_ONNX_OPSETS.start}-{SUPPORTED_ONNX_OPSETS.stop - 1} (those before 13 brought to their opset-13 form)")
    return 0
