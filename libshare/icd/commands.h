/* The command buffers' private shapes: shared by commands.c (pools, the lifecycle, the lists), record.c
 * (transfers, barriers, events, secondary command buffers) and dispatch.c (pipelines, descriptor sets,
 * push constants, dispatches); query.c includes it for ls_icd_command_buffer_of, ls_icd_fail,
 * ls_icd_buffer_range and ls_icd_encode.
 * loader.c includes it for the entry points; other files append commands through icd.h's ls_icd_record. */
#ifndef LIBSHARE_ICD_COMMANDS_H
#define LIBSHARE_ICD_COMMANDS_H

#include "cache.h"
#include "icd.h"
#include "ring.h"

#define LS_ICD_MOST_SETS 32     /* descriptor sets bound at once (set numbers 0..31) */
#define LS_ICD_MOST_DYNAMIC 32  /* dynamic offsets of one set */

/* vkCmdSetEvent (value 1) or vkCmdResetEvent (0), applied when a submission is answered. */
struct ls_icd_event_op {
    uint64_t event;
    int value;
};

struct ls_icd_recording {
    VkResult error;             /* the first failure while recording, answered by vkEndCommandBuffer */
    struct ls_desc *commands;   /* recorded (a primary's until loaded as lists at the end) */
    uint32_t ncommands, capacity;
    struct ls_icd_cached **held; /* the bind groups and lists it holds (cache.c), one a use */
    uint32_t nheld, held_capacity;
    struct ls_icd_event_op *events;
    uint32_t nevents, event_capacity;
    uint64_t pipeline;          /* the bound compute pipeline's handle, or 0 */
    uint64_t sets[LS_ICD_MOST_SETS];                     /* bound descriptor sets' handles, or 0 */
    uint32_t dynamic[LS_ICD_MOST_SETS][LS_ICD_MOST_DYNAMIC]; /* their dynamic offsets */
    uint64_t pushed[LS_ICD_MOST_SETS];  /* each set number's set of push descriptors (template.c), or 0 */
    uint8_t push[LS_MAX_PUSH];  /* vkCmdPushConstants' bytes */
    /* kept across resets (forget() clears everything above) */
    VkCommandBufferLevel level;
};

struct ls_icd_command_buffer *ls_icd_command_buffer_of(VkCommandBuffer handle);
VkResult ls_icd_fail(struct ls_icd_command_buffer *cb, VkResult result, const char *why);
int ls_icd_grow(void **items, uint32_t *capacity, uint32_t wanted, size_t size);
/* record.c: the arbiter's buffer and absolute offset of a VkBuffer's range, checked inside it; its size */
int ls_icd_buffer_range(struct ls_icd_device *device, uint64_t buffer, uint64_t offset, uint64_t size, uint32_t *id,
                        uint64_t *at);
uint64_t ls_icd_buffer_size(struct ls_icd_device *device, uint64_t buffer);
/* commands.c: ``cached`` (held for the recording) kept, to be given back with it; -1 (the recording's
 * error set, ``cached`` given back) when out of host memory. */
int ls_icd_keep_held(struct ls_icd_command_buffer *cb, struct ls_icd_cached *cached);
VkResult ls_icd_record_barrier(struct ls_icd_command_buffer *cb);
/* record.c: a command of ``opcode`` (ls_encode_op's arguments after the slot, program and groups 0) encoded
 * and appended (ls_icd_record); one the ring cannot encode makes the recording invalid. */
VkResult ls_icd_encode(struct ls_icd_command_buffer *cb, uint32_t opcode, uint32_t nbuffers, const uint32_t *buffers,
                       uint32_t noffsets, const uint64_t *offsets, const void *push, uint32_t push_size);


/* The entry points (loader.c's table): commands.c (pools, the lifecycle), record.c, dispatch.c */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateCommandPool(VkDevice handle, const VkCommandPoolCreateInfo *info,
                                                        const VkAllocationCallbacks *allocator, VkCommandPool *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyCommandPool(VkDevice handle, VkCommandPool pool,
                                                     const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetCommandPool(VkDevice handle, VkCommandPool pool,
                                                       VkCommandPoolResetFlags flags);
VKAPI_ATTR void VKAPI_CALL ls_icd_TrimCommandPool(VkDevice handle, VkCommandPool pool, VkCommandPoolTrimFlags flags);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_AllocateCommandBuffers(VkDevice handle, const VkCommandBufferAllocateInfo *info,
                                                             VkCommandBuffer *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_FreeCommandBuffers(VkDevice handle, VkCommandPool pool, uint32_t count,
                                                     const VkCommandBuffer *buffers);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_BeginCommandBuffer(VkCommandBuffer handle, const VkCommandBufferBeginInfo *info);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EndCommandBuffer(VkCommandBuffer handle);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetCommandBuffer(VkCommandBuffer handle, VkCommandBufferResetFlags flags);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdCopyBuffer(VkCommandBuffer handle, VkBuffer src, VkBuffer dst, uint32_t count,
                                                const VkBufferCopy *regions);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdFillBuffer(VkCommandBuffer handle, VkBuffer dst, VkDeviceSize offset,
                                                VkDeviceSize size, uint32_t data);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdUpdateBuffer(VkCommandBuffer handle, VkBuffer dst, VkDeviceSize offset,
                                                  VkDeviceSize size, const void *data);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPipelineBarrier(VkCommandBuffer handle, VkPipelineStageFlags src,
                                                     VkPipelineStageFlags dst, VkDependencyFlags flags,
                                                     uint32_t nmemory, const VkMemoryBarrier *memory,
                                                     uint32_t nbuffer, const VkBufferMemoryBarrier *buffer,
                                                     uint32_t nimage, const VkImageMemoryBarrier *image);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPipelineBarrier2(VkCommandBuffer handle, const VkDependencyInfo *info);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdSetEvent(VkCommandBuffer handle, VkEvent event, VkPipelineStageFlags stages);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdResetEvent(VkCommandBuffer handle, VkEvent event, VkPipelineStageFlags stages);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdSetEvent2(VkCommandBuffer handle, VkEvent event, const VkDependencyInfo *info);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdResetEvent2(VkCommandBuffer handle, VkEvent event, VkPipelineStageFlags2 stages);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWaitEvents(VkCommandBuffer handle, uint32_t count, const VkEvent *events,
                                                VkPipelineStageFlags src, VkPipelineStageFlags dst, uint32_t nmemory,
                                                const VkMemoryBarrier *memory, uint32_t nbuffer,
                                                const VkBufferMemoryBarrier *buffer, uint32_t nimage,
                                                const VkImageMemoryBarrier *image);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWaitEvents2(VkCommandBuffer handle, uint32_t count, const VkEvent *events,
                                                 const VkDependencyInfo *infos);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWriteTimestamp2(VkCommandBuffer handle, VkPipelineStageFlags2 stage,
                                                     VkQueryPool pool, uint32_t query);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdExecuteCommands(VkCommandBuffer handle, uint32_t count,
                                                     const VkCommandBuffer *secondaries);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdBindPipeline(VkCommandBuffer handle, VkPipelineBindPoint point,
                                                  VkPipeline pipeline);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdBindDescriptorSets(VkCommandBuffer handle, VkPipelineBindPoint point,
                                                        VkPipelineLayout layout, uint32_t first, uint32_t count,
                                                        const VkDescriptorSet *sets, uint32_t ndynamic,
                                                        const uint32_t *dynamic);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPushDescriptorSetKHR(VkCommandBuffer handle, VkPipelineBindPoint point,
                                                          VkPipelineLayout layout, uint32_t set, uint32_t nwrites,
                                                          const VkWriteDescriptorSet *writes);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPushDescriptorSetWithTemplateKHR(VkCommandBuffer handle,
                                                                      VkDescriptorUpdateTemplate template,
                                                                      VkPipelineLayout layout, uint32_t set,
                                                                      const void *data);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPushConstants(VkCommandBuffer handle, VkPipelineLayout layout,
                                                   VkShaderStageFlags stages, uint32_t offset, uint32_t size,
                                                   const void *values);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdDispatch(VkCommandBuffer handle, uint32_t x, uint32_t y, uint32_t z);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdDispatchBase(VkCommandBuffer handle, uint32_t base_x, uint32_t base_y,
                                                  uint32_t base_z, uint32_t x, uint32_t y, uint32_t z);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdDispatchIndirect(VkCommandBuffer handle, VkBuffer buffer, VkDeviceSize offset);

#endif
