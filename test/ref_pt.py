#!/usr/bin/python3
# ref_pt.py: writes the PyTorch checkpoint fixtures of test/test_pt.c with torch.save, and what
# torch.load gives back for each (test/fixtures/pt_expected.txt). Not run by `make test`;
# needs python3-torch (Debian: apt-get install python3-torch). Run from the repository root:
#   /usr/bin/python3 test/ref_pt.py
#
# No ultralytics package is needed: small stand-in classes are registered under the real module
# paths (ultralytics.nn.tasks.DetectionModel, ultralytics.nn.modules.conv.Conv, ...), so pickle
# records exactly the globals an Ultralytics checkpoint holds, and the module tree has the same
# attribute names (model.0.conv, model.2.m.0.cv1, model.22.cv3.1.2, ...).
#
# Files (all in test/fixtures/):
#   pt_v8n_nc4.pt        yolov8n, nc=4 (the shapes dataset's classes), FP16, written like an
#                        Ultralytics release file after strip_optimizer: model = DetectionModel,
#                        ema = None, plus date, version, train_args, names and yaml. 6 MB: the one
#                        full network; torch 1.13 writes no byteorder record (64-byte aligned).
#   pt_tiny_ckpt.pt      a training checkpoint with both model and ema (different values, FP16):
#                        the reader must take ema; numpy scalars/arrays and a path in the metadata. Rewritten with a byteorder record, unaligned,
#                        under another archive folder name, with data descriptors.
#   pt_tiny_sd.pt        a plain state_dict (FP32, the _metadata attribute torch adds, a transposed
#                        and an offset view sharing one storage, a BF16 and an F64 tensor).
#   pt_tiny_sd_bo.pt     the same state_dict with a byteorder record added.
#   pt_v11.pt            a YOLO11-like checkpoint (a C3k2 module): must be refused by name.
#   pt_seg.pt            a segmentation checkpoint (SegmentationModel): refused by name.
#   pt_evil.pt           a pickle that would call os.system under torch.load: refused, never run.
#   pt_expected.txt      per file and tensor: name, dtype, shape, FNV-1a 64 of the float32
#                        (or int64) little-endian bytes of torch.load's values, and the first value.
import io, os, pathlib, struct, sys, types, zipfile
import numpy
from collections import OrderedDict
import torch
import torch.nn as nn

OUT = "test/fixtures"


# ---- stand-ins registered under the Ultralytics module paths ----
def register(modname, cls):
    parts = modname.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
        if i > 1:
            setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[name])
    cls.__module__ = modname
    setattr(sys.modules[modname], cls.__name__, cls)
    return cls


class Conv(nn.Module):
    default_act = nn.SiLU()   # shared by every Conv, as in Ultralytics (one pickled object, memo refs)

    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = self.default_act


class Bottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut):
        super().__init__()
        self.cv1 = Conv(c1, c2, 3)
        self.cv2 = Conv(c2, c2, 3)
        self.add = shortcut and c1 == c2


class C2f(nn.Module):
    def __init__(self, c1, c2, n, shortcut):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut) for _ in range(n))


class SPPF(nn.Module):
    def __init__(self, c1, c2):
        super().__init__()
        self.cv1 = Conv(c1, c1 // 2, 1)
        self.cv2 = Conv(c1 // 2 * 4, c2, 1)
        self.m = nn.MaxPool2d(5, 1, 2)


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.d = 1


class DFL(nn.Module):
    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1


class Detect(nn.Module):
    def __init__(self, nc, ch):
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, len(ch), 16
        self.no = nc + 64
        self.stride = torch.tensor([8.0, 16.0, 32.0])
        c2, c3 = max(16, ch[0] // 4, 64), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 64, 1)) for x in ch)
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
        self.dfl = DFL(16)


class DetectionModel(nn.Module):
    def __init__(self, layers, yaml, names):
        super().__init__()
        self.yaml = yaml
        self.model = nn.Sequential(*layers)
        self.save = [4, 6, 9, 12, 15, 18, 21]
        self.names = names
        self.inplace = True
        self.stride = torch.tensor([8.0, 16.0, 32.0])


class SegmentationModel(DetectionModel):
    pass


class C3k2(C2f):
    pass


register("ultralytics.nn.modules.conv", Conv)
register("ultralytics.nn.modules.conv", Concat)
register("ultralytics.nn.modules.block", Bottleneck)
register("ultralytics.nn.modules.block", C2f)
register("ultralytics.nn.modules.block", SPPF)
register("ultralytics.nn.modules.block", DFL)
register("ultralytics.nn.modules.block", C3k2)
register("ultralytics.nn.modules.head", Detect)
register("ultralytics.nn.tasks", DetectionModel)
register("ultralytics.nn.tasks", SegmentationModel)


def yolov8(scale, nc, names):
    depth, width, max_ch = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024)}[scale]
    ch = lambda c: int(-(-min(c, max_ch) * width // 8) * 8)
    rep = lambda r: max(round(r * depth), 1) if r > 1 else r
    L = []
    L.append(Conv(3, ch(64), 3, 2))
    L.append(Conv(ch(64), ch(128), 3, 2))
    L.append(C2f(ch(128), ch(128), rep(3), True))
    L.append(Conv(ch(128), ch(256), 3, 2))
    L.append(C2f(ch(256), ch(256), rep(6), True))
    L.append(Conv(ch(256), ch(512), 3, 2))
    L.append(C2f(ch(512), ch(512), rep(6), True))
    L.append(Conv(ch(512), ch(1024), 3, 2))
    L.append(C2f(ch(1024), ch(1024), rep(3), True))
    L.append(SPPF(ch(1024), ch(1024)))
    L.append(nn.Upsample(None, 2, "nearest"))
    L.append(Concat())
    L.append(C2f(ch(1024) + ch(512), ch(512), rep(3), False))
    L.append(nn.Upsample(None, 2, "nearest"))
    L.append(Concat())
    L.append(C2f(ch(512) + ch(256), ch(256), rep(3), False))
    L.append(Conv(ch(256), ch(256), 3, 2))
    L.append(Concat())
    L.append(C2f(ch(256) + ch(512), ch(512), rep(3), False))
    L.append(Conv(ch(512), ch(512), 3, 2))
    L.append(Concat())
    L.append(C2f(ch(512) + ch(1024), ch(1024), rep(3), False))
    L.append(Detect(nc, (ch(256), ch(512), ch(1024))))
    for i, m in enumerate(L):   # what Ultralytics' parse_model attaches to every layer
        m.i, m.f = i, -1
        m.type = type(m).__module__ + "." + type(m).__name__
        m.np = sum(p.numel() for p in m.parameters())
    yaml = {"nc": nc, "scale": scale, "scales": {"n": [0.33, 0.25, 1024], "s": [0.33, 0.5, 1024]},
            "backbone": [[-1, 1, "Conv", [64, 3, 2]]], "head": [[[15, 18, 21], 1, "Detect", ["nc"]]],
            "yaml_file": "yolov8%s.yaml" % scale, "ch": 3}
    return DetectionModel(L, yaml, names)


def randomize(model, gen):
    # non-trivial BN statistics, so a wrong buffer mapping changes the outputs
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.normal_(0, 0.1, generator=gen)
                m.running_mean.normal_(0, 0.2, generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
                m.num_batches_tracked.fill_(1234)


def train_args(model_name):
    return {"task": "detect", "mode": "train", "model": model_name, "data": "data/shapes/data.yaml", "epochs": 40,
            "batch": 16, "imgsz": 160, "optimizer": "auto", "lr0": 0.01, "mosaic": 1.0, "amp": True, "name": None}


# ---- zip rewriting (byteorder record, folder name, alignment, data descriptors) ----
class NoSeek(io.RawIOBase):
    """a write-only stream: zipfile then writes data descriptors (flag bit 3) after every entry"""
    def __init__(self, f):
        self.f = f
    def writable(self):
        return True
    def write(self, b):
        return self.f.write(b)


def rewrite(src, dst, folder=None, byteorder=True, descriptors=False):
    with zipfile.ZipFile(src) as zin:
        items = [(i.filename, zin.read(i.filename)) for i in zin.infolist()]
    old = items[0][0].split("/")[0]
    folder = folder or old
    out = []
    for name, data in items:
        name = folder + name[len(old):]
        out.append((name, data))
        if byteorder and name.endswith("/data.pkl"):
            out.append((folder + "/byteorder", b"little"))
    with open(dst, "wb") as raw:
        f = NoSeek(raw) if descriptors else raw
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
            for name, data in out:
                z.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), data)


# ---- expected values: what torch.load gives ----
def fnv64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def expected(path, key):
    obj = torch.load(path, map_location="cpu")
    if isinstance(obj, dict) and ("model" in obj or "ema" in obj):
        m = obj.get("ema") or obj.get("model")
        sd = m.state_dict()
    else:
        sd = obj
    lines = []
    for name, t in sd.items():
        if t.dtype.is_floating_point:
            vals = t.detach().float().contiguous().numpy().astype("<f4").tobytes()
            first = "%.9g" % t.reshape(-1)[0].float().item() if t.numel() else "-"
        else:
            vals = t.detach().long().contiguous().numpy().astype("<i8").tobytes()
            first = str(t.reshape(-1)[0].item()) if t.numel() else "-"
        shape = "x".join(str(s) for s in t.shape) or "scalar"
        lines.append("%s %s %s %s %016x %s" % (key, name, str(t.dtype).replace("torch.", ""), shape, fnv64(vals), first))
    return lines


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    names = {0: "circle", 1: "rectangle", 2: "triangle", 3: "diamond"}

    # 1. the full yolov8n, nc=4, as an Ultralytics release file (strip_optimizer: ema moved to
    #    model, optimizer dropped, FP16)
    m = yolov8("n", 4, names)
    randomize(m, gen)
    m.args = train_args("yolov8n.yaml")
    ck = {"date": "2024-01-01T00:00:00", "version": "8.0.200", "license": "AGPL-3.0 License",
          "docs": "https://docs.ultralytics.com", "epoch": -1, "best_fitness": None, "model": m.half(),
          "ema": None, "updates": None, "optimizer": None, "train_args": train_args("yolov8n.yaml"),
          "train_metrics": {"metrics/mAP50(B)": 0.5, "fitness": 0.4}, "train_results": None}
    torch.save(ck, OUT + "/pt_v8n_nc4.pt")

    # 2. a tiny training checkpoint with model and ema; the file is rewritten with a byteorder
    #    record, another folder name and data descriptors
    def tiny(seed):
        torch.manual_seed(seed)
        t = DetectionModel([Conv(3, 8, 3, 2), Conv(8, 16, 3, 2)], {"nc": 2, "scale": "n"}, {0: "a", 1: "b"})
        randomize(t, torch.Generator().manual_seed(seed))
        return t.half()
    # metadata as some Ultralytics versions leave it: numpy scalars and arrays, a pathlib path
    ta = train_args("yolov8n.pt")
    ta["save_dir"] = pathlib.PosixPath("runs/detect/train")
    ck = {"date": "2024-02-02T00:00:00", "version": "8.1.0", "epoch": 7, "best_fitness": numpy.float64(0.25), "model": tiny(2),
          "ema": tiny(3), "updates": 70, "optimizer": {"state": {}, "param_groups": []}, "train_args": ta,
          "train_metrics": {"metrics/mAP50(B)": numpy.float32(0.5), "fitness": numpy.float64(0.4)},
          "train_results": {"epoch": numpy.arange(3), "loss": numpy.array([1.5, 1.2, 1.0])}}
    torch.save(ck, "/tmp/pt_tiny_ckpt.pt")
    rewrite("/tmp/pt_tiny_ckpt.pt", OUT + "/pt_tiny_ckpt.pt", folder="last", byteorder=True, descriptors=True)

    # 3. a plain state_dict (FP32) with views, BF16 and F64 tensors; with and without byteorder
    t = tiny(4).float()
    sd = t.state_dict()
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.5 - 3
    sd["extra.transposed"] = base.t()            # strides (1, 6): not contiguous
    sd["extra.offset"] = base[1:, 2:]            # storage offset 8, strides (6, 1)
    sd["extra.bf16"] = torch.tensor([1.5, -2.25, 3e-3], dtype=torch.bfloat16)
    sd["extra.f64"] = torch.tensor([[0.1, 0.2], [1e-30, -7.0]], dtype=torch.float64)
    torch.save(sd, OUT + "/pt_tiny_sd.pt")
    rewrite(OUT + "/pt_tiny_sd.pt", OUT + "/pt_tiny_sd_bo.pt", byteorder=True)

    # 4. files the reader must refuse by name
    v11 = DetectionModel([Conv(3, 8, 3, 2), C3k2(8, 8, 1, True)], {"nc": 2, "scale": "n"}, {0: "a", 1: "b"})
    torch.save({"model": v11.half(), "ema": None, "version": "8.3.0"}, OUT + "/pt_v11.pt")
    seg = SegmentationModel([Conv(3, 8, 3, 2)], {"nc": 2}, {0: "a", 1: "b"})
    torch.save({"model": seg.half(), "ema": None}, OUT + "/pt_seg.pt")

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > /tmp/yolo_pt_pwned",))
    torch.save({"model": Evil()}, OUT + "/pt_evil.pt")

    lines = []
    for key in ["pt_v8n_nc4", "pt_tiny_ckpt", "pt_tiny_sd", "pt_tiny_sd_bo"]:
        lines += expected(OUT + "/" + key + ".pt", key)
    with open(OUT + "/pt_expected.txt", "w") as f:
        f.write("# written by test/ref_pt.py (torch %s): file tensor dtype shape fnv64(float32|int64 LE bytes) first\n"
                % torch.__version__)
        f.write("\n".join(lines) + "\n")
    for n in sorted(os.listdir(OUT)):
        if n.startswith("pt_"):
            print("%-22s %9d bytes" % (n, os.path.getsize(OUT + "/" + n)))


if __name__ == "__main__":
    main()
