/* PLACEHOLDER until commands.c lands (replaced whole): no command buffer can be made, so none is taken.
 *
 * queue.c and submit.c call these two (icd.h's commands.c section); the real file records vkCmd*
 * into the arbiter's command lists. */
#include "icd.h"

VkResult ls_icd_command_buffer_take(struct ls_icd_command_buffer *cb, const uint32_t **lists, uint32_t *nlists)
{
    (void)cb, (void)lists, (void)nlists;
    return LS_ICD_INVALID;
}

void ls_icd_command_buffer_done(struct ls_icd_command_buffer *cb)
{
    (void)cb;
}
