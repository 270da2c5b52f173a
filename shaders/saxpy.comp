#version 450
// saxpy: y[i] = a * x[i] + y[i] for every i < n.
// Dispatch ceil(n / 64) workgroups.

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n;
    float a;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.n) {
        y[i] = pc.a * x[i] + y[i];
    }
}
