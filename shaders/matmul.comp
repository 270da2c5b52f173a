#version 450
// matmul: C = A * B for row-major float matrices A (M x K), B (K x N), C (M x N).
//
// Each 16x16 workgroup computes one 16x16 tile of C, walking along K one
// 16-wide tile at a time through shared memory. Dispatch
// (ceil(N / 16), ceil(M / 16), 1) workgroups. Sizes need not be multiples of
// 16: tile loads past the edge of A or B read as zero, and invocations past
// the edge of C take part in the loads but write nothing.
// lavapipe ends any loop after 65535 trips, which caps K there at about
// 16 * 65535 (checked: K = 70000 exact, K = 1100000 wrong); real GPUs do not.

#define TILE 16

layout(local_size_x = TILE, local_size_y = TILE) in;

layout(std430, set = 0, binding = 0) readonly buffer MatA { float A[]; };
layout(std430, set = 0, binding = 1) readonly buffer MatB { float B[]; };
layout(std430, set = 0, binding = 2) writeonly buffer MatC { float C[]; };

layout(push_constant) uniform Push {
    uint M;
    uint N;
    uint K;
} pc;

shared float tileA[TILE][TILE];
shared float tileB[TILE][TILE];

void main() {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint col = gl_WorkGroupID.x * TILE + tx;
    uint row = gl_WorkGroupID.y * TILE + ty;

    float acc = 0.0;
    for (uint k0 = 0u; k0 < pc.K; k0 += TILE) {
        uint ak = k0 + tx;
        uint bk = k0 + ty;
        tileA[ty][tx] = (row < pc.M && ak < pc.K) ? A[row * pc.K + ak] : 0.0;
        tileB[ty][tx] = (bk < pc.K && col < pc.N) ? B[bk * pc.N + col] : 0.0;
        barrier();

        for (uint k = 0u; k < TILE; ++k) {
            acc += tileA[ty][k] * tileB[k][tx];
        }
        barrier();
    }

    if (row < pc.M && col < pc.N) {
        C[row * pc.N + col] = acc;
    }
}
