#version 450
// busy: burn a chosen amount of device time with a result the host can check.
//
// For every i < n, start from x = i, apply `iterations` rounds of
//     x ^= x << 13;  x ^= x >> 17;  x ^= x << 5;   (xorshift32)
//     x = x * 1664525 + 1013904223;                (LCG step)
// in wrapping 32-bit unsigned arithmetic, then store data[i] = x. Each round
// depends on the one before and the result is stored, so no compiler can drop
// the work. The host reproduces data with numpy uint32 arrays.
// Dispatch ceil(n / 64) workgroups; run time grows with n * iterations.
//
// The rounds run 16 to a loop trip because lavapipe (llvmpipe) silently ends
// loops once an invocation has made 65535 loop trips in all, counted across
// every loop in the shader (LP_MAX_TGSI_LOOP_ITERATIONS). Here that is about
// iterations / 16 + iterations % 16 trips, so iterations up to 1,000,000 are
// exact on lavapipe (checked there); for longer dispatches, raise n instead.
// Real GPUs have no such cap.

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) writeonly buffer Data { uint data[]; };

layout(push_constant) uniform Push {
    uint n;
    uint iterations;
} pc;

uint hash_round(uint x) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x * 1664525u + 1013904223u;
}

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) {
        return;
    }
    uint x = i;
    for (uint trip = 0u; trip < pc.iterations / 16u; ++trip) {
        x = hash_round(x); x = hash_round(x); x = hash_round(x); x = hash_round(x);
        x = hash_round(x); x = hash_round(x); x = hash_round(x); x = hash_round(x);
        x = hash_round(x); x = hash_round(x); x = hash_round(x); x = hash_round(x);
        x = hash_round(x); x = hash_round(x); x = hash_round(x); x = hash_round(x);
    }
    for (uint r = 0u; r < pc.iterations % 16u; ++r) {
        x = hash_round(x);
    }
    data[i] = x;
}
