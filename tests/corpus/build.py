"""Build the corpus: compile each chosen shader as its project compiles it, and write the manifest.

    python tests/corpus/build.py --sources DIR

DIR holds each project's tree as fetched (DIR/ncnn, DIR/ggml, DIR/kompute, DIR/sascha; the
commits are in each project's SOURCES.md). The .spv files and manifest.json are committed, so the
tests never run this; run it again to change the corpus. Needs glslangValidator and glslc.

How each project compiles, reproduced here:

* ncnn (src/gpu.cpp ``compile_spirv_module``): glslang, GLSL for Vulkan 1.0 / SPIR-V 1.0, the
  ``#extension`` lines and ``#define`` block that the option set selects inserted after
  ``#version``; the block is read from gpu.cpp itself (:func:`ncnn_defines` evaluates its if/else
  chains for the option set). Device macros (``ncnn_<extension>``, ``ncnn_<feature>``) are left
  undefined, as for a device with no optional extension, which keeps every shader on its plain
  path. At pipeline creation ncnn patches the module's LocalSize (``inject_local_size_xyz``):
  so does :func:`ncnn_local_size` here, with the size the run uses. Two option sets: fp32 (every
  ``use_*`` off) and fp16 storage (``use_fp16_storage`` on, arithmetic in fp32).
* ggml (vulkan-shaders-gen.cpp ``string_to_spv_func``): ``glslc -fshader-stage=compute
  --target-env=vulkan1.2 -O`` (no -O for rope) with the variant's ``-D`` defines.
* Kompute (cmake/vulkan_shader_compiler.cmake) and Sascha Willems' samples
  (shaders/glsl/compileshaders.py): ``glslangValidator -V``.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from tools.corpus import Module

BUFFER_BYTES = 64 << 10  # every storage buffer: large enough for every index the chosen sizes produce

# --------------------------------------------------------------------------------------------- ncnn

NCNN_1D = ["absval", "celu", "clip", "dropout", "eltwise", "elu", "erf", "gelu", "hardsigmoid", "hardswish", "mish",
           "selu", "shrink", "sigmoid", "softplus", "swish", "tanh", "unaryop", "relu"]
NCNN_3D = ["batchnorm", "binaryop", "binaryop_pack4", "concat", "crop", "deepcopy", "flatten", "interp", "padding",
           "permute", "pixelshuffle", "pooling", "prelu", "reorg", "reshape", "scale", "shufflechannel", "slice",
           "softmax_reduce_max", "innerproduct", "convolutiondepthwise", "cast_fp32_to_fp16", "convolution_packed",
           "layernorm_reduce_sum4_fp32", "rotaryembed"]
NCNN_FP16 = ["relu", "sigmoid", "binaryop", "batchnorm", "pooling", "innerproduct", "convolutiondepthwise",
             "cast_fp32_to_fp16"]
# constants ncnn would set that differ from the module's defaults (the rest keep their defaults)
NCNN_CONSTANTS = {"relu": {0: 0.125}, "clip": {0: -0.5, 1: 0.5}, "unaryop": {0: 6}, "binaryop": {0: 2},
                  "binaryop_pack4": {0: 2}, "eltwise": {0: 1}, "dropout": {0: 0.5}, "interp": {0: 1},
                  "shrink": {0: 0.25, 1: 0.5}}
NCNN_DIMS = {"dims": 3, "w": 8, "h": 4, "d": 1, "c": 4, "cstep": 32, "n": 128, "size": 128, "group": 2,
             "num_output": 4, "embed_dim": 8, "seqlen": 4, "num_heads": 4, "stride": 32}
NCNN_FLOATS = 0.5


def ncnn_defines(gpu_cpp: str, opt: dict[str, bool], support: dict[str, bool]) -> list[tuple[str, str]]:
    """The (name, value) macros that gpu.cpp's compile_spirv_module defines for option set ``opt``
    on a device with ``support``: its if/else chains, translated to Python and run."""
    start = gpu_cpp.index("DefinitionCollector custom_defines;")
    end = gpu_cpp.index('custom_defines.append("ncnn_glsl_version", 1);')
    body = gpu_cpp[start:end].splitlines() + ['custom_defines.append("ncnn_glsl_version", 1);']
    python, depth, skipping = ["out = []"], 0, False
    for raw in body:
        line = raw.strip()
        if line.startswith("#if __APPLE__"):
            skipping = True
        if skipping:
            skipping = not line.startswith("#endif")
            continue
        if not line or line.startswith("//") or line.startswith("DefinitionCollector") or line.startswith("const ") \
                or line.startswith("int device_index") or line.startswith("if (device_index") \
                or line.startswith("device_index ="):
            continue
        cond = re.match(r"(else if|if) \((.*)\)$", line)
        if cond:
            test = cond.group(2).replace("&&", " and ").replace("||", " or ")
            test = re.sub(r"opt\.(\w+)", r"opt['\1']", test)
            test = re.sub(r"!(\w)", r"not \1", test)
            python.append("    " * depth + ("elif " if cond.group(1) == "else if" else "if ") + test + ":")
        elif line == "else":
            python.append("    " * depth + "else:")
        elif line == "{":
            depth += 1
            python.append("    " * depth + "pass")
        elif line == "}":
            depth -= 1
        elif line.startswith("custom_defines.append("):
            args = line[len("custom_defines.append("):-2]
            args = re.sub(r'(\w+) \? ("(?:[^"\\]|\\.)*") : ("(?:[^"\\]|\\.)*")', r"(\2 if \1 else \3)", args)
            python.append("    " * depth + f"out.append(({args}))")
        else:
            raise ValueError(f"gpu.cpp line not understood: {line!r}")
    scope = {"opt": opt, **support}
    exec("\n".join(python), scope)  # noqa: S102 - gpu.cpp's own branches, from the fetched tree
    return [(k, str(v)) for k, v in scope["out"]]


NCNN_OPTIONS = {
    "fp32": {},
    "fp16s": {"use_fp16_storage": True},
}
NCNN_SUPPORT = {"support_fp16_storage": True, "support_fp16_uniform": True, "support_int16_arithmetic": True}
_NCNN_OPT_NAMES = ("use_bf16_storage", "use_bf16_packed", "use_fp16_packed", "use_fp16_storage", "use_fp16_uniform",
                   "use_fp16_arithmetic", "use_int8_packed", "use_int8_storage", "use_int8_uniform",
                   "use_int8_arithmetic", "use_int16_packed", "use_int16_storage", "use_shader_local_memory",
                   "use_subgroup_ops", "use_cooperative_matrix")


def ncnn_source(tree: Path, name: str, variant: str) -> tuple[str, dict]:
    gpu_cpp = (tree / "src/gpu.cpp").read_text()
    opt = {k: False for k in _NCNN_OPT_NAMES} | NCNN_OPTIONS[variant]
    defines = ncnn_defines(gpu_cpp, opt, NCNN_SUPPORT)
    exts = ["GL_EXT_shader_explicit_arithmetic_types_int64", "GL_EXT_shader_explicit_arithmetic_types_int16"]
    if opt["use_fp16_storage"]:
        exts.append("GL_EXT_shader_16bit_storage")
    shader_dir = tree / "src/layer/vulkan/shader"
    text = (shader_dir / f"{name}.comp").read_text()
    text = re.sub(r'#include "([^"]+)"', lambda m: (shader_dir / m.group(1)).read_text(), text)
    head, _, rest = text.partition("#version 450\n")
    preamble = "".join(f"#extension {e}: require\n" for e in exts) + "".join(f"#define {k} {v}\n" for k, v in defines)
    return head + "#version 450\n" + preamble + rest, {"option_set": variant, "defines": len(defines)}


def ncnn_local_size(spirv: bytes, size: tuple[int, int, int]) -> bytes:
    """ncnn's inject_local_size_xyz: LocalSize set to ``size``, SpecIds 233-235 and the
    WorkgroupSize built-in (with the constants behind them) removed."""
    words = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    out, pos, ids, wgsize = words[:5], 5, set(), None
    while pos < len(words):  # first pass: the ids to drop
        count, op = words[pos] >> 16, words[pos] & 0xFFFF
        if op == 71 and words[pos + 2] == 1 and words[pos + 3] in (233, 234, 235):
            ids.add(words[pos + 1])
        if op == 71 and words[pos + 2] == 11 and words[pos + 3] == 25:
            wgsize = words[pos + 1]
        pos += count
    pos = 5
    while pos < len(words):
        count, op = words[pos] >> 16, words[pos] & 0xFFFF
        inst = words[pos:pos + count]
        pos += count
        if op == 16 and inst[2] == 17:
            inst = inst[:3] + list(size)
        elif op == 50 and inst[2] in ids or op == 51 and inst[2] == wgsize and len(inst) == 6:
            continue
        elif op == 71 and (inst[1] in ids and inst[2] == 1 or inst[2] == 11 and inst[3] == 25):
            continue
        out += inst
    return struct.pack(f"<{len(out)}I", *out)


def ncnn_push(module: Module) -> list[dict]:
    fields = []
    for f in module.push_fields():
        name = f["name"]
        base = re.sub(r"^(out|a|b)(?=dims|w$|h$|d$|c$|cstep)", "", name)
        if f["kind"][0] == "f":
            value = NCNN_FLOATS
        else:
            value = NCNN_DIMS.get(base, 0 if "offset" in name or name in ("left", "top", "front") else 1)
        fields.append({**f, "value": value})
    return fields


# --------------------------------------------------------------------------------------------- the rest


def compile_glsl(tool: str, source: str, target: str, defines: dict[str, str], optimize: bool,
                 include: Path | None = None) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "shader.comp", Path(tmp) / "shader.spv"
        src.write_text(source)
        if tool == "glslc":
            cmd = ["glslc", "-fshader-stage=compute", f"--target-env={target}", str(src), "-o", str(out)]
            cmd += ["-O"] if optimize else []
            cmd += [f"-D{k}={v}" for k, v in defines.items()]
        else:
            cmd = ["glslangValidator", "-V", "--target-env", target, "-S", "comp", str(src), "-o", str(out)]
            cmd += [f"-D{k}={v}" for k, v in defines.items()]
        if include is not None:
            cmd.append(f"-I{include}")
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode:
            raise RuntimeError(f"{' '.join(cmd)}:\n{result.stdout}{result.stderr}")
        return out.read_bytes()


def bindings_of(module: Module, sizes: dict[int, int] | None = None) -> list[dict]:
    out = []
    for r in module.resources():
        entry = {"set": r["set"], "binding": r["binding"], "kind": r["kind"], "count": r["count"] or 1}
        if r["kind"] in ("storage", "uniform"):
            fixed = max((o + 8 for v in r["views"] for o, _ in v["fixed"]), default=0)
            default = BUFFER_BYTES if r["kind"] == "storage" else max(256, -(-fixed // 256) * 256)
            entry["bytes"] = (sizes or {}).get(r["binding"], default) * entry["count"]
            entry["views"] = r["views"]
            view = next((v for v in r["views"] if v["array"] or v["fixed"]), None)
            kinds = [k for _, k in ((view["array"]["fields"] if view["array"] else view["fixed"]) if view else [])]
            entry["compare_as"] = next((k for k in kinds if k[0] == "f"), kinds[0] if kinds else "u8")
        out.append(entry)
    return out


def push_of(module: Module, values: dict[str, float], names: Module | None = None) -> dict:
    """The push block's fields with their values by name (names from ``names``, the same module
    compiled without the optimizer, where -O stripped them: the offsets are the same)."""
    fields = module.push_fields()
    if names is not None:
        by_offset = {f["offset"]: f["name"] for f in names.push_fields()}
        fields = [{**f, "name": by_offset.get(f["offset"], f["name"])} for f in fields]
    size = max((f["offset"] + {"f64": 8, "i64": 8, "u64": 8, "f16": 2, "i16": 2, "u16": 2, "i8": 1,
                                "u8": 1}.get(f["kind"], 4) for f in fields), default=0)
    return {"size": -(-size // 4) * 4,
            "fields": [{**f, "value": values.get(f["name"], values.get(f["name"].split(".")[-1], 0))} for f in fields]}


def typed_constants(module: Module, constants: dict[int, object]) -> dict:
    """The constants a project sets, typed by the module (a bool set from a 32-bit word, as ggml
    sets them, is that word != 0)."""
    out = {}
    for k, v in constants.items():
        if k in module.spec:
            kind = module.spec[k]["type"]
            out[str(k)] = {"type": kind, "value": bool(v) if kind == "bool" else v}
    return out


def entry_for(project: str, name: str, source: str, spirv: bytes, target: str, compiled: dict, **run) -> dict:
    module = Module(spirv)
    out = HERE / project / f"{name}.spv"
    out.write_bytes(spirv)
    return {"name": f"{project}/{name}", "project": project, "source": source, "spv": f"{project}/{name}.spv",
            "compiled": compiled, "target_env": target, "spirv_version": "%d.%d" % module.version,
            "capabilities": sorted(set(module.capabilities)), "local_size": list(module.workgroup_size()), **run}


def build_ncnn(tree: Path) -> list[dict]:
    out = []
    for variant, names in (("fp32", NCNN_1D + NCNN_3D), ("fp16s", NCNN_FP16)):
        for name in names:
            one_d = name in NCNN_1D
            source, info = ncnn_source(tree, name, variant)
            spirv = compile_glsl("glslangValidator", source, "vulkan1.0", {}, False)
            local = (64, 1, 1) if one_d else (4, 4, 4)
            spirv = ncnn_local_size(spirv, local)
            module = Module(spirv)
            fields = ncnn_push(module)
            size = max((f["offset"] + 4 for f in fields), default=0)
            constants = typed_constants(module, NCNN_CONSTANTS.get(name, {}))
            out.append(entry_for(
                "ncnn", f"{name}_{variant}", f"src/layer/vulkan/shader/{name}.comp", spirv, "vulkan1.0",
                {"tool": "glslangValidator -V --target-env vulkan1.0 (as ncnn's glslang call)", **info,
                 "local_size_injected": list(local)},
                bindings=bindings_of(module), push={"size": size, "fields": fields},
                groups=[2, 1, 1], constants=constants))
    return out


KOMPUTE = [  # (name, path, constants, groups)
    ("test_shader", "test/shaders/glsl/test_shader.comp", {}, [64, 1, 1]),
    ("test_workgroup_shader", "test/shaders/glsl/test_workgroup_shader.comp", {}, [16, 8, 1]),
    ("logistic_regression", "src/shaders/glsl/ShaderLogisticRegression.comp", {0: 64.0}, [64, 1, 1]),
    ("op_mult", "src/shaders/glsl/ShaderOpMult.comp", {0: 64, 1: 64, 2: 64}, [64, 1, 1]),
    ("array_multiplication", "examples/array_multiplication/shader/my_shader.comp", {}, [64, 1, 1]),
    ("android_simple", "examples/android/android-simple/app/src/main/cpp/shader/my_shader.comp", {0: 64}, [64, 1, 1]),
    ("ext_printf", "examples/vulkan_ext_printf/shader/example_shader.comp", {}, [16, 1, 1]),
]

SASCHA = [  # (name, path, constants, groups)
    ("computeheadless", "computeheadless/headless.comp", {0: 32}, [32, 1, 1]),
    ("particle", "computeparticles/particle.comp", {}, [4, 1, 1]),
    ("nbody_calculate", "computenbody/particle_calculate.comp", {0: 256, 1: 0.002, 2: 0.75, 3: 0.05}, [2, 1, 1]),
    ("nbody_integrate", "computenbody/particle_integrate.comp", {}, [2, 1, 1]),
    ("cloth", "computecloth/cloth.comp", {}, [2, 2, 1]),
    ("cull", "computecullandlod/cull.comp", {}, [2, 1, 1]),
    ("raytracing", "computeraytracing/raytracing.comp", {}, [4, 4, 1]),
    ("edgedetect", "computeshader/edgedetect.comp", {}, [4, 4, 1]),
    ("emboss", "computeshader/emboss.comp", {}, [4, 4, 1]),
    ("sharpen", "computeshader/sharpen.comp", {}, [4, 4, 1]),
]


SET_FIELDS = {  # uniform-buffer fields a run needs set: {name: {binding: [(offset, kind, value)]}}
    "nbody_calculate": {1: [(4, "i32", 256)]},  # ubo.particleCount: all 2 x 256 invocations work
}


def build_plain(project: str, tree: Path, table, prefix: str = "") -> list[dict]:
    out = []
    for name, path, constants, groups in table:
        source = (tree / prefix / path).read_text()
        spirv = compile_glsl("glslangValidator", source, "vulkan1.0", {}, False, include=(tree / prefix / path).parent)
        module = Module(spirv)
        bindings = bindings_of(module)
        for b in bindings:
            if b["binding"] in SET_FIELDS.get(name, {}):
                b["set_fields"] = SET_FIELDS[name][b["binding"]]
        out.append(entry_for(project, name, prefix + path, spirv, "vulkan1.0", {"tool": "glslangValidator -V"},
                             bindings=bindings, push=push_of(module, {}), groups=groups,
                             constants=typed_constants(module, constants)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sources", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=["ncnn", "ggml", "kompute", "sascha"])
    args = parser.parse_args()
    manifest_path = HERE / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"shaders": []}
    keep = [e for e in old["shaders"] if e["project"] not in args.only]
    known = {e["name"]: e.get("known_refusal") for e in old["shaders"]}
    built = []
    for project in args.only:
        (HERE / project).mkdir(exist_ok=True)
        tree = args.sources / project
        if project == "ncnn":
            built += build_ncnn(tree)
        elif project == "kompute":
            built += build_plain("kompute", tree, KOMPUTE)
        elif project == "sascha":
            built += build_plain("sascha", tree, SASCHA, "shaders/glsl/")
        elif project == "ggml":
            from tests.corpus.build_ggml import build_ggml
            built += build_ggml(tree, entry_for, compile_glsl, bindings_of, push_of, typed_constants)
    for e in built:
        if known.get(e["name"]):
            e["known_refusal"] = known[e["name"]]
    shaders = sorted(keep + built, key=lambda e: e["name"])
    manifest_path.write_text(json.dumps({"shaders": shaders}, indent=1) + "\n")
    print(f"{len(built)} built, {len(shaders)} in the manifest")


if __name__ == "__main__":
    main()
