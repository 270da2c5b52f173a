#version 450
// vadd: c[i] = a[i] + b[i] for every i < n.
// Dispatch ceil(n / 64) workgroups.

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer C { float c[]; };

layout(push_constant) uniform Push {
    uint n;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.n) {
        c[i] = a[i] + b[i];
    }
}
