#version 450
// sum: partial sums of input[0..n).
//
// Workgroup g reduces input[64*g .. 64*g + 63] (elements at or past n count as
// zero) in shared memory and writes the result to output[g]. Dispatch
// G = ceil(n / 64) workgroups; output must hold at least G floats.
//
// What the host does: the total is the sum of output[0..G). Either read the G
// partials back and add them on the host, or, while G > 1, dispatch this
// shader again with input = the previous output and n = G (each pass divides
// the count by 64) until a single value remains in output[0].

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Input { float data_in[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Output { float data_out[]; };

layout(push_constant) uniform Push {
    uint n;
} pc;

shared float partial[64];

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint i = gl_GlobalInvocationID.x;
    partial[lid] = (i < pc.n) ? data_in[i] : 0.0;
    barrier();

    // Tree reduction: halve the number of active invocations each step.
    for (uint stride = 32u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        barrier();
    }

    if (lid == 0u) {
        data_out[gl_WorkGroupID.x] = partial[0];
    }
}
