"""An unmodified ncnn program: a small network on ncnn's Vulkan compute path and on its CPU path, as JSON.

``python _ncnn_app.py [run|hold|loop|steps|again]`` writes a network into a temporary folder: a ``.param`` text
(Input 3x16x16, a 3x3 Convolution of 8 outputs with its ReLU, a 2x2 max Pooling, an InnerProduct of
10 and a Softmax) and its ``.bin`` of weights drawn from a seeded numpy generator (float32, the
weight blobs each after ncnn's 4-byte raw-float tag). It runs the network on one seeded input twice,
``opt.use_vulkan_compute`` on then off, extracting every layer's blob (``conv``, ``pool``, ``fc``,
``prob``), and prints one JSON line: ``gpus`` (``ncnn.get_gpu_count()``), ``on_gpu`` (whether the
first network kept ``use_vulkan_compute`` once loaded: ncnn turns it off, and runs on the CPU, when its
Vulkan device could not be made ready), ``gpu`` and ``cpu`` (each blob's values as a flat list, or
``{"error": ...}`` when ncnn refused). fp16 storage and arithmetic
are turned off, so the Vulkan path computes in float32 whatever the device offers. With ``hold`` it
then prints ``holding`` and waits until its standard input closes; with ``loop`` it prints
``looping`` and runs the Vulkan path again until it is killed; with ``steps``, it times its
Vulkan path on demand, and with ``again`` runs it again on demand (_steps.py). It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import ncnn
import numpy as np
from _steps import again, steps

PARAM = """7767517
5 5
Input            data   0 1 data 0=16 1=16 2=3
Convolution      conv   1 1 data conv 0=8 1=3 4=1 5=1 6=216 9=1
Pooling          pool   1 1 conv pool 0=0 1=2 2=2
InnerProduct     fc     1 1 pool fc 0=10 1=1 2=5120
Softmax          prob   1 1 fc prob 0=0
"""
BLOBS = ("conv", "pool", "fc", "prob")
RAW_FLOAT = np.zeros(1, np.uint32).tobytes()  # the tag before a raw float32 weight blob


def write_network(folder: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(34)
    param, model = folder / "net.param", folder / "net.bin"
    param.write_text(PARAM)
    with model.open("wb") as out:
        for weights, bias in ((216, 8), (5120, 10)):  # Convolution, InnerProduct
            out.write(RAW_FLOAT + (rng.standard_normal(weights) * 0.2).astype(np.float32).tobytes())
            out.write(rng.standard_normal(bias).astype(np.float32).tobytes())
    return param, model


def load(param: Path, model: Path, vulkan: bool) -> ncnn.Net:
    net = ncnn.Net()
    net.opt.use_vulkan_compute = vulkan
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    net.opt.num_threads = 1
    if net.load_param(str(param)) != 0 or net.load_model(str(model)) != 0:
        raise RuntimeError("ncnn did not load the network")
    return net


def infer(net: ncnn.Net, image: np.ndarray) -> dict:
    extractor = net.create_extractor()
    extractor.input("data", ncnn.Mat(image))
    out = {}
    for blob in BLOBS:
        code, mat = extractor.extract(blob)
        out[blob] = np.array(mat).ravel().tolist() if code == 0 else {"error": code}
    return out


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "run"
    image = np.random.default_rng(7).standard_normal((3, 16, 16)).astype(np.float32)
    with tempfile.TemporaryDirectory() as folder:
        param, model = write_network(Path(folder))
        seen = {"gpus": ncnn.get_gpu_count()}
        gpu = load(param, model, vulkan=True)
        seen["on_gpu"] = bool(gpu.opt.use_vulkan_compute)
        seen["gpu"] = infer(gpu, image)
        seen["cpu"] = infer(load(param, model, vulkan=False), image)
        print(json.dumps(seen), flush=True)
        if mode == "hold":
            print("holding", flush=True)
            sys.stdin.read()
        elif mode == "loop":
            print("looping", flush=True)
            while True:
                infer(gpu, image)
        elif mode == "steps":
            steps(lambda: infer(gpu, image))
        elif mode == "again":
            again(lambda: {"on_gpu": True, "gpu": infer(gpu, image)})
        del gpu
    ncnn.destroy_gpu_instance()


if __name__ == "__main__":
    main()
