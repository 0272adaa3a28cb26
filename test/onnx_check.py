"""onnx_check.py MODEL.onnx OPSET NC IMGSZ BATCH: onnx.checker.check_model(full_check=True) on an exported
model, then the parts deployment code reads: input images (B, 3, H, W), output output0 (B, 4+NC, A), and the
metadata Ultralytics' AutoBackend parses (stride, batch, imgsz, names and args as Python literals, task).
Exit 0 ok, 1 failed (reason printed), 3 the installed onnx is older than OPSET (skipped). Used by
test/test_onnx.c."""
import ast
import sys

import onnx

path, opset, nc, imgsz, batch = sys.argv[1], *map(int, sys.argv[2:6])
if opset > onnx.defs.onnx_opset_version():
    print(f"onnx {onnx.__version__} knows opsets up to {onnx.defs.onnx_opset_version()}, the model uses {opset}")
    sys.exit(3)
m = onnx.load(path)
try:
    onnx.checker.check_model(m, full_check=True)
except Exception as e:  # the checker's message names the node and the problem
    print(f"{path}: onnx.checker: {e}")
    sys.exit(1)


def dims(v):
    return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]


meta = {p.key: p.value for p in m.metadata_props}
errors = []
if [i.name for i in m.graph.input] != ["images"] or [o.name for o in m.graph.output] != ["output0"]:
    errors.append(f"inputs {[i.name for i in m.graph.input]} outputs {[o.name for o in m.graph.output]}")
din, dout = dims(m.graph.input[0]), dims(m.graph.output[0])
if din[1] != 3 or dout[1] != 4 + nc:
    errors.append(f"images {din} output0 {dout}")
for key in ("description", "author", "date", "version", "license", "docs", "stride", "task", "batch", "imgsz", "names", "args"):
    if key not in meta:
        errors.append(f"metadata '{key}' missing")
if not errors:
    names = ast.literal_eval(meta["names"])
    args = ast.literal_eval(meta["args"])
    if int(meta["stride"]) != 32 or meta["task"] != "detect" or int(meta["batch"]) != batch:
        errors.append(f"stride {meta['stride']} task {meta['task']} batch {meta['batch']}")
    if ast.literal_eval(meta["imgsz"]) != [imgsz, imgsz]:
        errors.append(f"imgsz {meta['imgsz']}")
    if sorted(names) != list(range(nc)) or not all(isinstance(v, str) for v in names.values()):
        errors.append(f"names {meta['names']}")
    if args.get("opset") != opset or args.get("batch") != batch:
        errors.append(f"args {meta['args']}")
    if m.opset_import[0].version != opset:
        errors.append(f"opset_import {m.opset_import[0].version}")
if errors:
    print(f"{path}: " + "; ".join(errors))
    sys.exit(1)
