// The engine's own program for LS_OP_DISPATCH_INDIRECT (libshare/arbiter/engine/recordings.c,
// "Indirect dispatches"): one workgroup of one invocation, recorded before a client's indirect
// dispatch. It reads the client's three group counts and writes into the dispatch's slot of the
// engine's buffer either those counts (verdict 0) or (0, 0, 0) with verdict 1, when a count is past
// the device's limit or their product past 2^32 - 1. vkCmdDispatchIndirect then reads the slot.
//
// Buffers: 0 = the client's buffer holding the counts (read only), 1 = the engine's slots
// (uvec4 each: x, y, z, verdict). Push constants: the counts' index in buffer 0 (in uint32
// words), the slot, the device's three limits. Dispatch: 1 x 1 x 1.
#version 450

layout(local_size_x = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer Counts { uint counts[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Slots { uvec4 slots[]; };

layout(push_constant) uniform Push {
    uint word;
    uint slot;
    uint limit_x, limit_y, limit_z;
} p;

void main() {
    uvec3 n = uvec3(counts[p.word], counts[p.word + 1u], counts[p.word + 2u]);
    bool refused = any(greaterThan(n, uvec3(p.limit_x, p.limit_y, p.limit_z)));
    // the product past 2^32 - 1, in 32-bit arithmetic: x * y overflows when y > (2^32 - 1) / x
    if (n.x != 0u && n.y > 0xffffffffu / n.x) {
        refused = true;
    } else if (n.x * n.y != 0u && n.z > 0xffffffffu / (n.x * n.y)) {
        refused = true;
    }
    slots[p.slot] = refused ? uvec4(0u, 0u, 0u, 1u) : uvec4(n, 0u);
}
