#!/usr/bin/env python3
"""ref_data.py: writes test/fixtures/data_cv2.bin, the OpenCV reference outputs that
test/test_data.c compares the C resize, warp and HSV code against (bit for bit).

Needs numpy and OpenCV (Debian: apt-get install python3-opencv; run with /usr/bin/python3).
The ops are written the way Ultralytics calls them (load_image's cv2.resize INTER_LINEAR,
RandomPerspective's float32 matrices and warpAffine/warpPerspective with border 114,
RandomHSV's LUTs on the BGR image). Layout (all little endian, no padding):
  "CV2REF1\\0", then the records below in order; each image record is raw HWC uint8 RGB,
  each matrix record 9 float64 (row-major 3x3).
"""
import math
import struct
import sys

import cv2
import numpy as np


def src_img(w, h):
    """The test pattern, same formula as test_data.c: high frequency, every rounding shows."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.zeros((h, w, 3), np.uint8)
    for c in range(3):
        img[..., c] = ((x * 37 + y * 91 + c * 53 + ((x * y) % 29) * 7) & 255).astype(np.uint8)
    return img


def color_grid():
    """16x16 RGB grid covering every hue sector and low/high saturation."""
    y, x = np.mgrid[0:16, 0:16]
    return np.stack([x * 17, y * 17, ((x + y) * 8) % 256], -1).astype(np.uint8)


RESIZES = [(23, 17, 40, 29), (23, 17, 11, 8), (23, 17, 7, 16), (97, 61, 40, 25)]
# (src w, src h, dst w, dst h, persp x, persp y, degrees, scale, shear x, shear y, translate x, y)
WARPS = [(48, 48, 24, 24, 0, 0, 7.5, 0.8, 2.0, -3.0, 0.45, 0.58),
         (40, 30, 40, 30, 0, 0, 30.0, 1.3, 0.0, 0.0, 0.5, 0.5),
         (40, 30, 40, 30, 0.001, -0.0007, -12.0, 1.1, 1.0, 0.0, 0.52, 0.47)]
HSV_GAINS = [(0.01, -0.5, 0.3), (-0.013, 0.6, -0.35), (0.0149, 0.699, 0.399)]


def ultra_matrix(sw, sh, dw, dh, px, py, deg, scale, shx, shy, tx, ty):
    """RandomPerspective.affine_transform's M = T @ S @ R @ P @ C (float32) for fixed draws."""
    C = np.eye(3, dtype=np.float32)
    C[0, 2] = -sw / 2
    C[1, 2] = -sh / 2
    P = np.eye(3, dtype=np.float32)
    P[2, 0] = px
    P[2, 1] = py
    R = np.eye(3, dtype=np.float32)
    R[:2] = cv2.getRotationMatrix2D(angle=deg, center=(0, 0), scale=scale)
    S = np.eye(3, dtype=np.float32)
    S[0, 1] = math.tan(shx * math.pi / 180)
    S[1, 0] = math.tan(shy * math.pi / 180)
    T = np.eye(3, dtype=np.float32)
    T[0, 2] = tx * dw
    T[1, 2] = ty * dh
    return T @ S @ R @ P @ C


def ultra_hsv(rgb, gains):
    """RandomHSV.__call__ with fixed gains, on the BGR image as Ultralytics holds it."""
    img = np.ascontiguousarray(rgb[..., ::-1])
    r = np.array(gains, dtype=np.float64)
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_BGR2HSV))
    x = np.arange(0, 256, dtype=r.dtype)
    lut_hue = ((x + r[0] * 180) % 180).astype(np.uint8)
    lut_sat = np.clip(x * (r[1] + 1), 0, 255).astype(np.uint8)
    lut_val = np.clip(x * (r[2] + 1), 0, 255).astype(np.uint8)
    lut_sat[0] = 0
    im_hsv = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    cv2.cvtColor(im_hsv, cv2.COLOR_HSV2BGR, dst=img)
    return img[..., ::-1]


def main(path):
    out = bytearray(b"CV2REF1\0")
    for sw, sh, w, h in RESIZES:
        out += cv2.resize(src_img(sw, sh), (w, h), interpolation=cv2.INTER_LINEAR).tobytes()
    for p in WARPS:
        sw, sh, dw, dh = p[:4]
        M = ultra_matrix(*p)
        out += struct.pack("<9d", *M.astype(np.float64).ravel())
        if p[4] or p[5]:
            img = cv2.warpPerspective(src_img(sw, sh), M, dsize=(dw, dh), borderValue=(114, 114, 114))
        else:
            img = cv2.warpAffine(src_img(sw, sh), M[:2], dsize=(dw, dh), borderValue=(114, 114, 114))
        out += np.ascontiguousarray(img).tobytes()
    for g in HSV_GAINS:
        out += np.ascontiguousarray(ultra_hsv(src_img(23, 17), g)).tobytes()
        out += np.ascontiguousarray(ultra_hsv(color_grid(), g)).tobytes()
    with open(path, "wb") as f:
        f.write(out)
    print(f"wrote {path}: {len(out)} bytes (OpenCV {cv2.__version__})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "test/fixtures/data_cv2.bin")
