#version 450
// busy: burn a chosen amount of GPU time with a result the host can check.
//
// For every i < n, start from x = i and apply `iterations` rounds of
//     x ^= x << 13;  x ^= x >> 17;  x ^= x << 5;   (xorshift32)
//     x = x * 1664525 + 1013904223;                (LCG step)
// in 32-bit unsigned arithmetic, then store data[i] = x. Every round depends
// on the one before and the result is stored, so the loop cannot be removed.
// The host reproduces it with numpy uint32 arrays (wrapping arithmetic).
// Dispatch ceil(n / 64) workgroups; run time grows linearly with iterations.

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) writeonly buffer Data { uint data[]; };

layout(push_constant) uniform Push {
    uint n;
    uint iterations;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) {
        return;
    }
    uint x = i;
    for (uint r = 0u; r < pc.iterations; ++r) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x = x * 1664525u + 1013904223u;
    }
    data[i] = x;
}
