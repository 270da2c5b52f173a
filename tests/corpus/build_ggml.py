"""ggml's Vulkan kernels for the corpus (see build.py): each variant's ``-D`` defines as
vulkan-shaders-gen.cpp passes them to ``glslc --target-env=vulkan1.2 [-O]``, and the
specialization constants and push-constant layout that ggml-vulkan.cpp creates its pipeline
with (``ggml_vk_create_pipeline``: constants 0..n-1 in order; ``device->subgroup_size`` is
lavapipe's 8).

Tensors are small and contiguous: 4 x 32-float rows in each of 2 planes (ne = 32, 4, 2, 1, strides
in elements nb = 1, 32, 128, 256), the same shape for every operand; the fast-division fields
(``*mp``, ``*_Ls``) are computed as ggml's ``init_fastdiv_values`` computes them.
"""

from __future__ import annotations

from pathlib import Path

SUBGROUP = 8
NE = (32, 4, 2, 1)
NB = (1, 32, 128, 256)
F32 = {"A_TYPE": "float", "D_TYPE": "float"}
F16 = {"A_TYPE": "float16_t", "D_TYPE": "float16_t"}
MMV_BASE = {"FLOAT_TYPE": "float", "FLOAT_TYPEV2": "vec2", "FLOAT_TYPEV4": "vec4", "FLOAT_TYPEV8": "vec4[2]",
            "ACC_TYPE": "float", "ACC_TYPEV2": "vec2"}

# (name, source, defines, optimize, constants {id: value}, groups, extra push values)
GGML = [
    ("cpy_f32_f32", "copy.comp", F32, True, {}, [1, 1, 1], {}),
    ("cpy_f32_f16", "copy.comp", {"A_TYPE": "float", "D_TYPE": "float16_t"}, True, {}, [1, 1, 1], {}),
    ("cpy_f16_f16", "copy.comp", {**F16, "OPTIMIZATION_ERROR_WORKAROUND": "1"}, True, {}, [1, 1, 1], {}),
    ("contig_cpy_f32_f16", "contig_copy.comp", {"A_TYPE": "float", "D_TYPE": "float16_t"}, True, {}, [1, 1, 1], {}),
    ("scale_f32", "scale.comp", {**F32, "FLOAT_TYPE": "float"}, True, {}, [1, 1, 1], {}),
    ("log_f32", "log.comp", F32, True, {}, [1, 1, 1], {}),
    ("gelu_f32", "unary.comp", {**F32, "OP": "op_gelu"}, True, {}, [1, 1, 1], {}),
    ("silu_f32", "unary.comp", {**F32, "OP": "op_silu"}, True, {}, [1, 1, 1], {}),
    ("sigmoid_f32", "unary.comp", {**F32, "OP": "op_sigmoid"}, True, {}, [1, 1, 1], {}),
    ("exp_f16", "unary.comp", {**F16, "OP": "op_exp"}, True, {}, [1, 1, 1], {}),
    ("add_f32_f32_f32", "add.comp", {"A_TYPE": "float", "B_TYPE": "float", "D_TYPE": "float", "FLOAT_TYPE": "float",
                                     "ADD_RMS": "0"}, True, {0: True}, [1, 1, 1], {}),
    ("add_f16_f32_f16", "add.comp", {"A_TYPE": "float16_t", "B_TYPE": "float", "D_TYPE": "float16_t",
                                     "FLOAT_TYPE": "float", "ADD_RMS": "0"}, True, {0: True}, [1, 1, 1], {}),
    ("mul_f32_f32_f32", "mul.comp", {"A_TYPE": "float", "B_TYPE": "float", "D_TYPE": "float", "FLOAT_TYPE": "float"},
     True, {0: False}, [1, 1, 1], {}),
    ("div_f32", "div.comp", {"A_TYPE": "float", "B_TYPE": "float", "D_TYPE": "float", "FLOAT_TYPE": "float"},
     True, {0: True}, [1, 1, 1], {}),
    ("silu_back_f32", "silu_back.comp", {"A_TYPE": "float", "B_TYPE": "float", "D_TYPE": "float"}, True, {}, [1, 1, 1],
     {}),
    ("diag_mask_inf_f32", "diag_mask_inf.comp", F32, True, {}, [1, 8, 1], {"n_past": 1}),
    ("norm_f32", "norm.comp", {**F32, "FLOAT_TYPE": "float"}, True, {}, [4, 2, 1], {}),
    ("rms_norm_f32", "rms_norm.comp", {"A_TYPE": "float", "B_TYPE": "float", "D_TYPE": "float",
                                       "FLOAT_TYPE": "float"}, True, {0: 0, 1: 0}, [4, 2, 1], {}),
    ("soft_max_f32", "soft_max.comp", {"A_TYPE": "float", "B_TYPE": "float", "D_TYPE": "float", "FLOAT_TYPE": "float"},
     True, {0: SUBGROUP}, [4, 2, 1], {}),
    ("argmax_f32", "argmax.comp", {"A_TYPE": "float", "D_TYPE": "int", "FLOAT_TYPE": "float"}, True, {0: SUBGROUP},
     [8, 1, 1], {}),
    ("sum_rows_f32", "sum_rows.comp", {**F32, "FLOAT_TYPE": "float"}, True, {0: SUBGROUP}, [4, 2, 1], {}),
    ("cumsum_f32", "cumsum.comp", {**F32, "FLOAT_TYPE": "float"}, True, {0: 256, 1: SUBGROUP, 2: 1}, [4, 2, 1], {}),
    # ggml sets NCOLS_PADDED_LOG2 with BLOCK_SIZE: left at its default (10) with a block of 32, the
    # bitonic sort indexes its 32-entry shared array up to 1023 (see the report of issue 33's corpus)
    ("argsort_f32", "argsort.comp", {"A_TYPE": "float"}, True, {0: 32, 1: 5}, [8, 1, 1],
     {"ncols_padded": 32, "ncols_padded_log2": 5}),
    ("rope_norm_f32", "rope_norm.comp", {"A_TYPE": "float", "ROPE_D_TYPE": "float"}, False, {}, [4, 1, 1], {}),
    ("get_rows_f32", "get_rows.comp", {"TEMP_TYPE": "FLOAT_TYPE", "DATA_A_F32": "1", "A_TYPE": "float",
                                       "B_TYPE": "int", "D_TYPE": "float", "FLOAT_TYPE": "float"}, True, {}, [1, 4, 1], {}),
    ("get_rows_f16", "get_rows.comp", {"TEMP_TYPE": "FLOAT_TYPE", "DATA_A_F16": "1", "A_TYPE": "float16_t",
                                       "B_TYPE": "int", "D_TYPE": "float16_t", "FLOAT_TYPE": "float"}, True, {}, [1, 4, 1],
     {}),
    ("dequant_q4_0", "dequant_q4_0.comp", {"DATA_A_Q4_0": "1", "D_TYPE": "float16_t", "FLOAT_TYPE": "float"}, True, {}, [1, 1, 1], {}),
    ("mul_mat_vec_f32_f32_f32", "mul_mat_vec.comp", {**MMV_BASE, "DATA_A_F32": "1", "A_TYPE": "float",
                                                     "A_TYPE_VEC4": "vec4", "B_TYPE": "float", "B_TYPEV2": "vec2",
                                                     "B_TYPEV4": "vec4", "D_TYPE": "float"},
     True, {0: 32, 1: 2, 2: 1}, [2, 1, 1], {}),
    ("mul_mat_vec_f16_f32_f32", "mul_mat_vec.comp", {**MMV_BASE, "DATA_A_F16": "1", "A_TYPE": "float16_t",
                                                     "A_TYPE_VEC4": "f16vec4", "B_TYPE": "float", "B_TYPEV2": "vec2",
                                                     "B_TYPEV4": "vec4", "D_TYPE": "float"},
     True, {0: 32, 1: 2, 2: 1}, [2, 1, 1], {}),
]


def _fastdiv(d: int) -> tuple[int, int]:
    """ggml's init_fastdiv_values: (mp, L)."""
    L = 0
    while L < 32 and (1 << L) < d:
        L += 1
    return ((1 << 32) * ((1 << L) - d) // d + 1) & 0xFFFFFFFF, L


def push_values() -> dict[str, float]:
    values: dict[str, float] = {"ne": NE[0] * NE[1] * NE[2] * NE[3], "KX": NE[0], "KY": NE[1] * NE[2],
                                "ncols": NE[0], "nrows": NE[1] * NE[2], "n_rows": NE[1] * NE[2],
                                "ncols_pad": NE[0], "nrows_x": NE[1] * NE[2], "nrows_y": NE[1],
                                "n_dims": NE[0], "rows_per_group": 1, "ne00": NE[0], "ne01": NE[1],
                                "param1": 0.5, "param2": 0.25, "scale": 0.5, "theta_scale": 0.5, "freq_scale": 1.0,
                                "ext_factor": 0.0, "attn_factor": 1.0, "corr_dims[0]": 1.0, "corr_dims[1]": 2.0,
                                "ncols_x": NE[0], "stride_x": NE[0], "stride_y": NE[0], "stride_d": NE[0],
                                "batch_stride_a": 128, "batch_stride_b": 128, "batch_stride_d": 128,
                                "M": 8, "K": NE[0], "N": 8, "ne02": NE[2], "ne12": NE[2], "broadcast2": 1,
                                "broadcast3": 1, "nchannels_x": 1, "nchannels_y": 1}
    for t in range(3):
        for i in range(4):
            values[f"ne{t}{i}"] = NE[i]
            values[f"nb{t}{i}"] = NB[i]
        for suffix, d in (("_012mp", NE[0] * NE[1] * NE[2]), ("_01mp", NE[0] * NE[1]), ("_0mp", NE[0])):
            values[f"ne{t}{suffix}"] = _fastdiv(d)[0]
        values[f"ne{t}_Ls"] = (_fastdiv(NE[0] * NE[1] * NE[2])[1] | _fastdiv(NE[0] * NE[1])[1] << 8
                               | _fastdiv(NE[0])[1] << 16)
    values["ne0_12mp"], values["ne0_12L"] = _fastdiv(NE[1] * NE[2])
    values["ne0_1mp"], values["ne0_1L"] = _fastdiv(NE[1])
    values.update({"n_cols": NE[0], "nel": 256, "stride_a": NE[0], "stride_b": NE[0], "misalign_offsets": 0})
    return values


def build_ggml(tree: Path, entry_for, compile_glsl, bindings_of, push_of, typed_constants) -> list[dict]:
    from tools.corpus import Module

    shaders = tree / "src/ggml-vulkan/vulkan-shaders"
    out = []
    for name, source, defines, optimize, constants, groups, extra in GGML:
        text = (shaders / source).read_text()
        try:
            spirv = compile_glsl("glslc", text, "vulkan1.2", defines, optimize, include=shaders)
        except RuntimeError as exc:
            print(f"ggml/{name}: not compiled: {str(exc)[-600:]}")
            continue
        module = Module(spirv)
        names = Module(compile_glsl("glslc", text, "vulkan1.2", defines, False, include=shaders)) if optimize else None
        values = {**push_values(), **extra}
        out.append(entry_for(
            "ggml", name, f"src/ggml-vulkan/vulkan-shaders/{source}", spirv, "vulkan1.2",
            {"tool": "glslc -fshader-stage=compute --target-env=vulkan1.2" + (" -O" if optimize else ""),
             "defines": defines},
            bindings=bindings_of(module), push=push_of(module, values, names), groups=groups,
            constants=typed_constants(module, constants)))
    return out
