/* The libshare Vulkan driver's private header: its objects and the calls between its files.
 *
 * The driver (libshare_icd.so) is an installable client driver that the Vulkan loader finds
 * through its manifest (libshare-run sets VK_DRIVER_FILES). Each file holds one concept:
 *
 *   loader.c    the loader interface: negotiation, vk_icdGetInstanceProcAddr,
 *               vk_icdGetPhysicalDeviceProcAddr, the table of the entry points offered
 *   wire.c      the control plane's frames (libshare/protocol/wire.py) over the arbiter's socket
 *   settings.c  the LIBSHARE_* environment a session reads (libshare/settings.py's client rows)
 *   hello.c     the hello that opens a session, and the welcome's physical device read and checked
 *   instance.c  VkInstance: creation (one session each), extensions, layers, the physical device
 *   physical.c  VkPhysicalDevice: properties, features, queue family, memory, formats (entry points in physical.h)
 *   device.c    VkDevice and VkQueue: the checks of vkCreateDevice, one session each, the queue
 *   objects.c   the device's table of non-dispatchable handles, checked; the create/destroy shape
 *   control.c   the device session's control requests: one frame sent, its reply read and checked
 *   memory.c    VkDeviceMemory: the arbiter's shared (memfd, mapped) and device buffers
 *   buffer.c    VkBuffer: a (memory, offset, size) view, its requirements and binding
 *   sync.c      VkFence and VkEvent (the host's side of them)
 *   semaphore.c VkSemaphore: binary, and timeline (VK_KHR_timeline_semaphore) with the host's signal and wait
 *   pipeline.c  VkShaderModule, VkPipelineLayout, VkPipeline (the arbiter's programs), VkPipelineCache
 *   descriptor.c  VkDescriptorSetLayout, VkDescriptorPool, VkDescriptorSet and their updates, templates
 *               (descriptor.h: its calls and view.c's)
 *   view.c      VkBufferView: the arbiter's texel view of a buffer's memory
 *   commands.c  VkCommandPool and VkCommandBuffer: the lifecycle, a recording loaded as the arbiter's
 *               command lists (commands.h: the recording's private shapes)
 *   record.c    vkCmd* copies, fills, updates, barriers, events and secondary command buffers recorded
 *   dispatch.c  vkCmd* pipelines, descriptor sets, push constants and dispatches (with bind groups)
 *   query.c     VkQueryPool (timestamps): an arbiter shared buffer read on the host, vkCmd*Query* recorded
 *   queue.c     the data path: the session's ring, its tickets, the submissions in flight, the waits
 *   reattach.c  surviving an arbiter's restart: what a new arbiter needs, kept; the move to it (reattach.h)
 *   submit.c    vkQueueSubmit and vkQueueSubmit2KHR: a submission read, checked and handed to queue.c
 *   refused.c   the markers of the core device-level commands not implemented, and the void queries' answers
 *   stubs.c     generated (_stubs.py): each marker's command as a typed stub, refused with an error or nothing
 *
 * Dispatchable objects (VkInstance, VkPhysicalDevice, VkDevice, VkQueue, VkCommandBuffer) begin with
 * the loader's VK_LOADER_DATA slot, set to ICD_LOADER_MAGIC when made; the loader writes its dispatch table there.
 * Functions return a VkResult, or a count, 0 or a negative errno. No Python runs in here.
 * docs/icd.md has the design. */
#ifndef LIBSHARE_ICD_H
#define LIBSHARE_ICD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <vulkan/vulkan.h>
#include <vulkan/vk_icd.h>

#include <cjson/cJSON.h>

#define LS_ICD_API_VERSION VK_API_VERSION_1_2 /* what the driver implements of the physical-device queries */
#define LS_ICD_DEVICE_PREFIX "libshare: "
#define LS_ICD_MAX_FDS 4                      /* wire.py's MAX_FDS */
#define LS_ICD_MAX_FRAME (4u << 20)           /* wire.py's MAX_FRAME */
#define LS_ICD_REPLY_MS 60000                 /* client/exchange.py's REPLY_TIMEOUT */
#define LS_ICD_LOAD_MS 300000                 /* client/attachment.py's LOAD_TIMEOUT: a load_program's wait, */
#define LS_ICD_LOAD_MARGIN_MS 30000           /* ... or the welcome's load_timeout and its LOAD_MARGIN if longer */
#define LS_ICD_WHY 512                        /* bytes of a failure's explanation */
#define LS_ICD_DIAL_MS 10000                  /* connect()'s timeout: a supervised directory's wait */

/* ---- wire.c: one received frame (the caller frees it with ls_icd_frame_free) */
struct ls_icd_frame {
    char *json;        /* NUL-terminated */
    uint32_t json_len;
    uint8_t *payload;
    uint32_t payload_len;
    int fds[LS_ICD_MAX_FDS];
    int nfds;
};

int ls_icd_dial(const char *path, const char *supervisor_lock, int wait_ms);
int ls_icd_send(int sock, const char *json, size_t json_len, const void *payload, size_t payload_len);
int ls_icd_send_fds(int sock, const char *json, size_t json_len, const void *payload, size_t payload_len,
                    const int *fds, int nfds);
/* Whether a control daemon holds ``lock``: it supervises the pipe directory (a dead arbiter is replaced). */
int ls_icd_supervised(const char *lock);
int ls_icd_recv(int sock, struct ls_icd_frame *frame, int max_fds, int timeout_ms);
void ls_icd_frame_free(struct ls_icd_frame *frame);

/* ---- settings.c: the session's options from the environment */
struct ls_icd_settings {
    char socket_path[4096];
    char supervisor_lock[4096]; /* the control daemon's lock file in the pipe directory */
    const char *name;      /* LIBSHARE_CLIENT_NAME, or NULL */
    const char *group;     /* LIBSHARE_GROUP, or NULL */
    const char *priority;  /* LIBSHARE_CLIENT_PRIORITY, or NULL */
    const char *share;     /* LIBSHARE_ACTIVE_THREAD_PERCENTAGE, or NULL */
    const char *mem_limit; /* LIBSHARE_DEVICE_MEM_LIMIT, or NULL */
};

int ls_icd_read_settings(struct ls_icd_settings *settings);
int ls_icd_parse_size(const char *text, uint64_t *bytes);

/* ---- hello.c: a session and the physical device its welcome describes */
struct ls_icd_instance;

#define LS_ICD_MOST_TEXEL_FORMATS 16   /* libshare/protocol/texels.py's TEXEL_FORMATS, at most */
#define LS_ICD_TEXEL_STORAGE 1u        /* a format's uses: a storage texel buffer (texels.py's TEXEL_STORAGE) */
#define LS_ICD_TEXEL_UNIFORM 2u        /* ... a uniform texel buffer (TEXEL_UNIFORM) */

/* A texel format a buffer view may have, as the welcome names it (the arbiter's view request takes its name) */
struct ls_icd_texel_format {
    char name[16];
    uint32_t vk_format, texel_bytes, uses;
};

#define LS_ICD_ROW_WORDS 2 /* 64-bit words of features.c's rows (at most 128) */

struct ls_icd_physical {
    VK_LOADER_DATA loader; /* first: the loader's slot */
    struct ls_icd_instance *instance;
    VkPhysicalDeviceProperties properties; /* the real device's, name and version ours */
    VkPhysicalDeviceFeatures features;     /* what the arbiter keeps safe */
    uint64_t reported[LS_ICD_ROW_WORDS];   /* features.c's rows reported on, a bit each */
    uint32_t driver_id;                    /* the arbiter's driver's VkDriverId (0: unknown) */
    VkConformanceVersion conformance;      /* the conformance version the arbiter's driver passed */
    VkSubgroupFeatureFlags subgroup_operations;     /* in the compute stage */
    uint32_t subgroup_size;
    uint32_t workgroup_subgroups;          /* maxComputeWorkgroupSubgroups (subgroup size control) */
    uint32_t max_per_set_descriptors;
    uint64_t max_allocation;
    uint8_t uuid[VK_UUID_SIZE];
    uint32_t timestamp_valid_bits;
    uint64_t memory; /* the device-local heap: the session's memory limit */
    struct ls_icd_texel_format texels[LS_ICD_MOST_TEXEL_FORMATS];
    uint32_t ntexels;
};

struct ls_icd_session {
    int sock;     /* the session's control socket */
    int ring_fd;  /* the ring's memfd (kept for the data path to map) */
    int bell_fd;  /* the doorbell */
    int64_t client_id;
    int64_t arbiter_pid; /* the welcome's: the data path watches it for the arbiter's death */
    int load_ms;         /* how long a load_program waits for its answer (the welcome's load_timeout) */
    int unread;          /* replies to frees sent and not read yet (control.c) */
};

VkResult ls_icd_hello(struct ls_icd_session *session, struct ls_icd_physical *physical, char *why, size_t why_size);
/* hello.c: how long a load_program waits, from the welcome's load_timeout (seconds, as the arbiter
 * bounds its compiles): that and LS_ICD_LOAD_MARGIN_MS, at least LS_ICD_LOAD_MS, which is also the
 * answer to a value that is not a number, 0 or below, or past 1e6 s */
struct cJSON;
int ls_icd_load_ms(const struct cJSON *load_timeout);
VkResult ls_icd_hello_again(struct ls_icd_session *session, struct ls_icd_physical *physical, char *why,
                            size_t why_size);
void ls_icd_session_close(struct ls_icd_session *session);

/* ---- instance.c */
struct ls_icd_instance {
    VK_LOADER_DATA loader; /* first: the loader's slot */
    VkAllocationCallbacks allocator;
    int has_allocator;
    uint32_t api_version;
    struct ls_icd_session session;
    struct ls_icd_physical physical;
};

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateInstance(const VkInstanceCreateInfo *info,
                                                     const VkAllocationCallbacks *allocator, VkInstance *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyInstance(VkInstance instance, const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateInstanceExtensionProperties(const char *layer, uint32_t *count,
                                                                          VkExtensionProperties *properties);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateInstanceVersion(uint32_t *version);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumeratePhysicalDevices(VkInstance instance, uint32_t *count,
                                                               VkPhysicalDevice *devices);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumeratePhysicalDeviceGroups(VkInstance instance, uint32_t *count,
                                                                    VkPhysicalDeviceGroupProperties *groups);

/* ---- physical.c: its entry points in physical.h (for loader.c); the texel format ``format`` is, or NULL */
const struct ls_icd_texel_format *ls_icd_texel_format(const struct ls_icd_physical *physical, VkFormat format);

/* ---- objects.c: a device's non-dispatchable handles. A handle is (generation << 32 | kind << 24 |
 * slot): looking one up checks its slot, kind and generation, so a wrong or stale handle is found
 * wanting, never followed. */
#define LS_ICD_INVALID VK_ERROR_UNKNOWN   /* invalid input the driver detects (the spec's meaning of it) */
#define LS_ICD_MOST_OBJECTS (1u << 20)    /* handles a device holds at once */

enum ls_icd_kind {
    LS_ICD_FREE = 0, LS_ICD_MEMORY, LS_ICD_BUFFER, LS_ICD_FENCE, LS_ICD_SEMAPHORE, LS_ICD_EVENT, LS_ICD_SHADER,
    LS_ICD_SET_LAYOUT, LS_ICD_PIPELINE_LAYOUT, LS_ICD_PIPELINE, LS_ICD_PIPELINE_CACHE, LS_ICD_DESCRIPTOR_POOL,
    LS_ICD_DESCRIPTOR_SET, LS_ICD_UPDATE_TEMPLATE, LS_ICD_COMMAND_POOL, LS_ICD_QUERY_POOL, LS_ICD_VIEW
};

struct ls_icd_memory {
    uint64_t size;      /* as allocated (allocationSize) */
    uint64_t rounded;   /* the arbiter's buffer: whole pages */
    int64_t buffer_id;  /* the arbiter's */
    uint32_t type;      /* 0 device-local, 1 host-visible */
    uint8_t *address;   /* the memfd's mapping (host-visible), or NULL */
    int mapped;         /* vkMapMemory'd */
};

struct ls_icd_buffer {
    uint64_t size;
    uint64_t memory;    /* its VkDeviceMemory's handle once bound, else 0 */
    uint64_t offset;
};

/* view.c: a VkBufferView, the arbiter's texel view of its buffer's memory */
struct ls_icd_view {
    int64_t view_id;    /* the arbiter's; -1 once its memory was freed (the arbiter freed it with it) */
    int64_t buffer_id;  /* the arbiter buffer it views: its VkBuffer's memory's */
    uint32_t uses;      /* its format's LS_ICD_TEXEL_* */
};

struct ls_icd_fence {
    int signaled;
    int pending;        /* a submission not yet answered will signal it (queue.c) */
};

/* semaphore.c: binary (value 1 once a submission that signals it is submitted, 0 once a submission
 * waits on it) or timeline (value: reached; promised: the largest a submission not yet answered will
 * signal) */
struct ls_icd_semaphore {
    int timeline;
    uint64_t value;
    uint64_t promised;
};

/* sync.c: an event's state as the host sees it */
struct ls_icd_event {
    int set;
};

/* pipeline.c: a VkShaderModule is its SPIR-V, kept until a pipeline is made from it */
struct ls_icd_shader {
    uint32_t *code;
    size_t size;        /* bytes */
};

/* descriptor.c: a set layout's bindings, sorted by binding number; a binding's descriptors are
 * entries [first, first + count) of a set made with it. Pipeline layouts and sets keep copies
 * (ls_icd_set_layout_copy): a layout may be destroyed while they live. */
struct ls_icd_layout_binding {
    uint32_t binding;
    VkDescriptorType type;
    uint32_t count;
    uint32_t first;
};

struct ls_icd_set_layout {
    struct ls_icd_layout_binding *bindings;
    uint32_t nbindings;
    uint32_t nentries;  /* the descriptors of a set made with it */
    VkDescriptorSetLayoutCreateFlags flags;
};

struct ls_icd_pipeline_layout {
    struct ls_icd_set_layout *sets; /* copies, nsets of them */
    uint32_t nsets;
    uint32_t push_size;             /* the end of its last push-constant range */
};

/* pipeline.c: what the arbiter's load_program reply says of the program a compute pipeline is */
struct ls_icd_resource {
    uint32_t set, binding, count;   /* the module's (set, binding), the buffers it takes */
};

struct ls_icd_pipeline {
    int64_t program_id;             /* the arbiter's */
    struct ls_icd_resource *resources; /* in the order a bind group names its buffers */
    uint32_t nresources;
    uint32_t nbuffers;              /* the sum of the resources' counts: a bind group's entries */
    uint32_t push_size;             /* the program's push constants, whole words (its layout's may be more) */
    uint32_t local_size[3];         /* as specialized */
};

/* descriptor.c: one descriptor of a set; buffer 0 until written (ls_icd_descriptor_resolve reads it) */
struct ls_icd_descriptor {
    VkDescriptorType type;
    uint64_t buffer;                /* its VkBuffer's handle, or 0: never written */
    uint64_t offset, range;         /* range VK_WHOLE_SIZE: to the buffer's end */
};

struct ls_icd_descriptor_set {
    uint64_t pool;                  /* its VkDescriptorPool's handle */
    struct ls_icd_set_layout layout; /* a copy */
    struct ls_icd_descriptor *entries; /* layout.nentries of them */
};

struct ls_icd_descriptor_pool {
    uint64_t *sets;                 /* the handles of the sets made from it and not freed */
    uint32_t nsets, capacity;
    uint32_t max_sets;
};

struct ls_icd_update_template {
    VkDescriptorUpdateTemplateEntry *entries;
    uint32_t nentries;
    int push;                       /* of type PUSH_DESCRIPTORS: for vkCmdPushDescriptorSetWithTemplateKHR */
};

/* query.c: a timestamp query pool, its queries' 16-byte slots (the stamp, its availability) in an
 * arbiter shared buffer, mapped */
struct ls_icd_query_pool {
    struct ls_icd_memory memory;    /* memory.c's ls_icd_memory_shared */
    uint32_t count;                 /* queries */
};

/* commands.c: a pool's command buffers (dispatchable: each allocated on its own) */
struct ls_icd_command_buffer;

struct ls_icd_command_pool {
    struct ls_icd_command_buffer **buffers;
    uint32_t nbuffers, capacity;
};

struct ls_icd_object {
    uint32_t kind;       /* enum ls_icd_kind */
    uint32_t generation; /* bumped each time the slot is reused */
    union {
        struct ls_icd_memory memory;
        struct ls_icd_buffer buffer;
        struct ls_icd_view view;
        struct ls_icd_fence fence;
        struct ls_icd_semaphore semaphore;
        struct ls_icd_event event;
        struct ls_icd_shader shader;
        struct ls_icd_set_layout set_layout;
        struct ls_icd_pipeline_layout pipeline_layout;
        struct ls_icd_pipeline pipeline;
        struct ls_icd_descriptor_set set;
        struct ls_icd_descriptor_pool descriptor_pool;
        struct ls_icd_update_template update_template;
        struct ls_icd_command_pool command_pool;
        struct ls_icd_query_pool query_pool;
    } u;
};

struct ls_icd_objects {
    struct ls_icd_object *slots;
    uint32_t used, capacity; /* slots[0, used) were ever used */
};

uint64_t ls_icd_object_new(struct ls_icd_objects *objects, uint32_t kind);
struct ls_icd_object *ls_icd_object_find(struct ls_icd_objects *objects, uint64_t handle, uint32_t kind);
void ls_icd_object_drop(struct ls_icd_objects *objects, uint64_t handle);
void ls_icd_objects_free(struct ls_icd_objects *objects);

/* ---- device.c */
struct ls_icd_device;

struct ls_icd_queue {
    VK_LOADER_DATA loader; /* first: the loader's slot */
    struct ls_icd_device *device;
};

struct ls_icd_device {
    VK_LOADER_DATA loader; /* first: the loader's slot */
    struct ls_icd_session session;  /* the device's own, from vkCreateDevice to vkDestroyDevice */
    struct ls_icd_physical seen;    /* what that session's welcome described (its memory limit) */
    struct ls_icd_queue queue;
    pthread_mutex_t lock;           /* over the session's socket and the objects */
    struct ls_icd_objects objects;
    uint64_t held;                  /* bytes of memory allocated */
    uint64_t alignment;             /* of a buffer's memory */
    uint32_t views;                 /* buffer views whose memory is live (view.c) */
    uint64_t frees;                 /* frees sent to the arbiter, ever (control.c) */
    VkAllocationCallbacks allocator;
    int has_allocator;
    uint32_t extensions;            /* LS_ICD_EXT_* enabled at vkCreateDevice */
    struct ls_icd_path *path;       /* queue.c's: the ring and the submissions in flight */
    struct ls_icd_ledger *ledger;   /* reattach.c's: what a new arbiter needs, or NULL */
    struct ls_icd_cache *cache;     /* cache.c's: bind groups and lists by content, or NULL */
    int told_unanswered;            /* control.c said once that the arbiter stopped answering */
};

/* The device extensions offered (physical.c's list), as bits of ls_icd_device.extensions (timeline
 * semaphores and the host's query reset also when enabled as Vulkan 1.2 features: device.c).
 * VK_KHR_synchronization2 is offered: commands.c records its vkCmd*2 commands (record.c). */
#define LS_ICD_OFFERS_SYNC2 1
#define LS_ICD_EXT_TIMELINE 1u      /* VK_KHR_timeline_semaphore */
#define LS_ICD_EXT_SYNC2 2u         /* VK_KHR_synchronization2 */
#define LS_ICD_EXT_QUERY_RESET 4u   /* VK_EXT_host_query_reset */
#define LS_ICD_EXT_PLAIN 8u         /* an extension with no command */
#define LS_ICD_EXT_PUSH 16u         /* VK_KHR_push_descriptor (descriptor.c, dispatch.c) */
#define LS_ICD_EXT_TEMPLATE 32u     /* VK_KHR_descriptor_update_template: core 1.1's commands, KHR names */
#define LS_ICD_EXT_MEMORY_REQUIREMENTS 64u /* VK_KHR_get_memory_requirements2: the same, KHR names */
#define LS_ICD_EXT_BIND_MEMORY 128u /* VK_KHR_bind_memory2: the same */
#define LS_ICD_EXT_MAINTENANCE1 256u /* VK_KHR_maintenance1: vkTrimCommandPoolKHR */
#define LS_ICD_EXT_MAINTENANCE3 512u /* VK_KHR_maintenance3: vkGetDescriptorSetLayoutSupportKHR */
#define LS_ICD_MOST_PUSHED 32u      /* maxPushDescriptors: a push set layout's descriptors, at most */
/* physical.c: the bit of an extension ``physical`` offers, else 0 */
uint32_t ls_icd_extension_bit(const struct ls_icd_physical *physical, const char *name);

/* objects.c, for the devices' create and destroy commands: a new object of ``kind`` whose union
 * starts as ``init`` (``size`` bytes; NULL: zeroed), made under the device's lock (VK_SUCCESS or
 * VK_ERROR_OUT_OF_HOST_MEMORY), and one dropped if ``handle`` is one of ``kind`` (1, else 0). */
VkResult ls_icd_object_create(struct ls_icd_device *device, uint32_t kind, const void *init, size_t size,
                              uint64_t *out);
int ls_icd_object_destroy(struct ls_icd_device *device, uint64_t handle, uint32_t kind);
/* Zeroed host memory of ``size`` bytes from ``allocator`` (the application's, for ``scope``) or, when it
 * is NULL, the C library; NULL when out. ls_icd_host_free gives it back to the same one. */
void *ls_icd_host_alloc(const VkAllocationCallbacks *allocator, size_t size, VkSystemAllocationScope scope);
void ls_icd_host_free(const VkAllocationCallbacks *allocator, void *memory);
/* The same, calling ``release`` (the lock held) on the object before its slot is dropped. */
int ls_icd_object_destroy_with(struct ls_icd_device *device, uint64_t handle, uint32_t kind,
                               void (*release)(struct ls_icd_device *device, struct ls_icd_object *object));

VkResult ls_icd_check_device(const struct ls_icd_physical *physical, const VkDeviceCreateInfo *info);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *info,
                                                   const VkAllocationCallbacks *allocator, VkDevice *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDevice(VkDevice device, const VkAllocationCallbacks *allocator);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceQueue(VkDevice device, uint32_t family, uint32_t index, VkQueue *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceQueue2(VkDevice device, const VkDeviceQueueInfo2 *info, VkQueue *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceGroupPeerMemoryFeatures(VkDevice device, uint32_t heap, uint32_t local,
                                                                   uint32_t remote, VkPeerMemoryFeatureFlags *out);

/* ---- control.c: the device session's requests (the device's lock held) */
VkResult ls_icd_ask(struct ls_icd_device *device, const char *text, const void *payload, size_t payload_len,
                    struct ls_icd_frame *frame, int max_fds, cJSON **reply, VkResult refused);
/* The same, its reply waited for up to ``reply_ms`` (a load_program: the session's load_ms). */
VkResult ls_icd_ask_within(struct ls_icd_device *device, int reply_ms, const char *text, const void *payload,
                           size_t payload_len, struct ls_icd_frame *frame, int max_fds, cJSON **reply,
                           VkResult refused);
int64_t ls_icd_whole_field(const cJSON *reply, const char *name, double least, double most);
void ls_icd_forget(struct ls_icd_device *device, const char *field, int64_t id); /* a free, its reply unread */
/* the unread replies read, every free done, unless each command buffer of ``s`` (NULL: any) ended its
 * recording after the last free */
struct ls_icd_submission;
void ls_icd_settle_frees(struct ls_icd_device *device, const struct ls_icd_submission *s);

/* ---- commands.c: a command buffer, recorded into the arbiter's command lists (engine/lists.c) */
enum ls_icd_cb_state { LS_ICD_CB_INITIAL = 0, LS_ICD_CB_RECORDING, LS_ICD_CB_EXECUTABLE, LS_ICD_CB_INVALID };

struct ls_icd_command_buffer {
    VK_LOADER_DATA loader;          /* first: the loader's slot */
    struct ls_icd_device *device;
    uint64_t pool;                  /* its VkCommandPool's handle */
    enum ls_icd_cb_state state;
    VkCommandBufferUsageFlags usage;
    uint32_t *lists;                /* once ended: the arbiter's lists it submits, in order */
    uint32_t nlists;
    uint32_t pending;               /* submissions of it not yet answered (queue.c) */
    int freed;                      /* freed while pending: released by the last ls_icd_command_buffer_done */
    uint64_t ended_after;           /* device->frees when its recording ended (control.c's settling) */
    struct ls_icd_recording *recording; /* commands.c's own: what is being recorded and bound */
};

/* For a submission (queue.c, the device's lock held): ``cb``'s lists, VK_SUCCESS, and it counts as
 * pending; LS_ICD_INVALID when it is not executable, or pending without SIMULTANEOUS_USE. */
VkResult ls_icd_command_buffer_take(struct ls_icd_command_buffer *cb, const uint32_t **lists, uint32_t *nlists);
/* A submission of ``cb`` was answered (freed: released once none is pending). */
void ls_icd_command_buffer_done(struct ls_icd_command_buffer *cb);
/* Append one encoded command (libshare/ring/ring.h's struct ls_desc, made with ls_encode_op) to
 * ``cb``'s recording: for the vkCmd* of other files (query.c's timestamps). VK_SUCCESS, or the
 * error that vkEndCommandBuffer will answer (the recording keeps the first). */
struct ls_desc;
VkResult ls_icd_record(struct ls_icd_command_buffer *cb, const struct ls_desc *command);
/* ``handle`` when it is one of the device's command buffers (in one of its pools), else NULL: a pointer
 * the application gives (vkQueueSubmit's, vkCmdExecuteCommands') is followed only then (the lock held). */
struct ls_icd_command_buffer *ls_icd_command_buffer_find(struct ls_icd_device *device, const void *handle);
/* vkDestroyDevice, the session closed: what a command pool ``object`` holds is freed (other kinds: nothing). */
void ls_icd_command_pool_free(struct ls_icd_object *object);
/* The entry points of commands.c, record.c and dispatch.c: commands.h. */

/* ---- memory.c */
void ls_icd_memory_release(struct ls_icd_device *device, struct ls_icd_memory *memory);
/* An arbiter shared buffer of ``size`` bytes, mapped, into *memory (the device's lock held; outside the
 * heap's count): VK_SUCCESS, or vkAllocateMemory's error. query.c's pools hold one. */
VkResult ls_icd_memory_shared(struct ls_icd_device *device, uint64_t size, struct ls_icd_memory *memory);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_AllocateMemory(VkDevice device, const VkMemoryAllocateInfo *info,
                                                     const VkAllocationCallbacks *allocator, VkDeviceMemory *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_FreeMemory(VkDevice device, VkDeviceMemory memory,
                                             const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_MapMemory(VkDevice device, VkDeviceMemory memory, VkDeviceSize offset,
                                                VkDeviceSize size, VkMemoryMapFlags flags, void **out);
VKAPI_ATTR void VKAPI_CALL ls_icd_UnmapMemory(VkDevice device, VkDeviceMemory memory);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_FlushMappedMemoryRanges(VkDevice device, uint32_t count,
                                                              const VkMappedMemoryRange *ranges);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceMemoryCommitment(VkDevice device, VkDeviceMemory memory,
                                                            VkDeviceSize *out);

/* ---- query.c */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateQueryPool(VkDevice device, const VkQueryPoolCreateInfo *info,
                                                      const VkAllocationCallbacks *allocator, VkQueryPool *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyQueryPool(VkDevice device, VkQueryPool pool,
                                                   const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetQueryPoolResults(VkDevice device, VkQueryPool pool, uint32_t first,
                                                          uint32_t count, size_t size, void *data,
                                                          VkDeviceSize stride, VkQueryResultFlags flags);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdResetQueryPool(VkCommandBuffer cb, VkQueryPool pool, uint32_t first,
                                                    uint32_t count);
VKAPI_ATTR void VKAPI_CALL ls_icd_ResetQueryPool(VkDevice device, VkQueryPool pool, uint32_t first, uint32_t count);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWriteTimestamp(VkCommandBuffer cb, VkPipelineStageFlagBits stage,
                                                    VkQueryPool pool, uint32_t query);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdCopyQueryPoolResults(VkCommandBuffer cb, VkQueryPool pool, uint32_t first,
                                                          uint32_t count, VkBuffer buffer, VkDeviceSize offset,
                                                          VkDeviceSize stride, VkQueryResultFlags flags);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdBeginQuery(VkCommandBuffer cb, VkQueryPool pool, uint32_t query,
                                                VkQueryControlFlags flags);
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdEndQuery(VkCommandBuffer cb, VkQueryPool pool, uint32_t query);

/* ---- buffer.c */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateBuffer(VkDevice device, const VkBufferCreateInfo *info,
                                                   const VkAllocationCallbacks *allocator, VkBuffer *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyBuffer(VkDevice device, VkBuffer buffer,
                                                const VkAllocationCallbacks *allocator);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetBufferMemoryRequirements(VkDevice device, VkBuffer buffer,
                                                              VkMemoryRequirements *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetBufferMemoryRequirements2(VkDevice device,
                                                               const VkBufferMemoryRequirementsInfo2 *info,
                                                               VkMemoryRequirements2 *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_BindBufferMemory(VkDevice device, VkBuffer buffer, VkDeviceMemory memory,
                                                       VkDeviceSize offset);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_BindBufferMemory2(VkDevice device, uint32_t count,
                                                        const VkBindBufferMemoryInfo *infos);

/* ---- sync.c */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateFence(VkDevice device, const VkFenceCreateInfo *info,
                                                  const VkAllocationCallbacks *allocator, VkFence *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyFence(VkDevice device, VkFence fence, const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetFences(VkDevice device, uint32_t count, const VkFence *fences);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetFenceStatus(VkDevice device, VkFence fence);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_WaitForFences(VkDevice device, uint32_t count, const VkFence *fences,
                                                    VkBool32 all, uint64_t timeout);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateEvent(VkDevice device, const VkEventCreateInfo *info,
                                                  const VkAllocationCallbacks *allocator, VkEvent *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyEvent(VkDevice device, VkEvent event, const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetEventStatus(VkDevice device, VkEvent event);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_SetEvent(VkDevice device, VkEvent event);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetEvent(VkDevice device, VkEvent event);
/* For commands.c, when a submission that sets or resets event ``handle`` was answered (the device's
 * lock held): its state becomes ``value`` (1 set, 0 reset); a handle no longer an event is ignored. */
void ls_icd_event_set(struct ls_icd_device *device, uint64_t handle, int value);

/* ---- semaphore.c */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateSemaphore(VkDevice device, const VkSemaphoreCreateInfo *info,
                                                      const VkAllocationCallbacks *allocator, VkSemaphore *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroySemaphore(VkDevice device, VkSemaphore semaphore,
                                                   const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetSemaphoreCounterValue(VkDevice device, VkSemaphore semaphore,
                                                               uint64_t *value);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_WaitSemaphores(VkDevice device, const VkSemaphoreWaitInfo *info,
                                                     uint64_t timeout);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_SignalSemaphore(VkDevice device, const VkSemaphoreSignalInfo *info);

/* ---- queue.c: the data path (docs/icd.md). A submission as submit.c hands it over: */
struct ls_icd_signal {
    uint64_t semaphore;             /* its handle */
    uint64_t value;                 /* timeline: the value; binary: 0 */
};

struct ls_icd_taken {
    struct ls_icd_command_buffer *cb;
    const uint32_t *lists;          /* from ls_icd_command_buffer_take */
    uint32_t nlists;
};

struct ls_icd_submission {
    struct ls_icd_taken *cbs;       /* malloc'd, owned by queue.c once handed over */
    uint32_t ncbs;
    struct ls_icd_signal *waits;    /* timeline waits alone (binary ones are settled at submit) */
    uint32_t nwaits;
    struct ls_icd_signal *signals;
    uint32_t nsignals;
    uint64_t fence;                 /* its handle, or 0 */
    uint64_t first, end;            /* its tickets, [first, end) once pushed */
    uint64_t next;                  /* its first ticket not yet answered */
    int pushed;
};

/* A wait's condition, looked at with the device's lock held: VK_SUCCESS (met), VK_NOT_READY, or an
 * error answered as is. */
typedef VkResult (*ls_icd_ready)(struct ls_icd_device *device, const void *arg);

VkResult ls_icd_path_open(struct ls_icd_device *device);
void ls_icd_path_close(struct ls_icd_device *device);
/* The device's lock held: VK_SUCCESS (queued: pushed, or held behind a timeline wait), else
 * VK_ERROR_DEVICE_LOST or VK_ERROR_OUT_OF_HOST_MEMORY with its command buffers handed back
 * (ls_icd_command_buffer_done); either way ``s``'s arrays are queue.c's. */
VkResult ls_icd_path_submit(struct ls_icd_device *device, struct ls_icd_submission *s);
/* The device's lock held: push the held submissions whose timeline waits are now reachable. */
void ls_icd_path_release(struct ls_icd_device *device);
/* The device's lock held: the answers read so far filed, answered submissions retired; 1 when lost. */
int ls_icd_path_poll(struct ls_icd_device *device);
/* Wait (the device's lock held, released while sleeping) until ``ready`` says VK_SUCCESS or an error,
 * up to ``timeout`` ns: VK_TIMEOUT; VK_ERROR_DEVICE_LOST once the device is lost. An infinite wait
 * with nothing queued that could end it answers VK_TIMEOUT (nothing ever would). */
VkResult ls_icd_path_wait(struct ls_icd_device *device, uint64_t timeout, ls_icd_ready ready, const void *arg);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_DeviceWaitIdle(VkDevice device);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_QueueWaitIdle(VkQueue queue);

/* ---- submit.c */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo *submits,
                                                  VkFence fence);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_QueueSubmit2(VkQueue queue, uint32_t count, const VkSubmitInfo2 *submits,
                                                   VkFence fence);

/* ---- refused.c: the rest of the core device-level commands (loader.c's table) */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_refused(void); /* markers in loader.c's tables: never called */
VKAPI_ATTR void VKAPI_CALL ls_icd_nothing(void);
VKAPI_ATTR uint64_t VKAPI_CALL ls_icd_zero(void);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetImageSparseMemoryRequirements(VkDevice device, VkImage image, uint32_t *count,
                                                                  VkSparseImageMemoryRequirements *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetImageSparseMemoryRequirements2(VkDevice device,
                                                                   const VkImageSparseMemoryRequirementsInfo2 *info,
                                                                   uint32_t *count,
                                                                   VkSparseImageMemoryRequirements2 *out);

/* ---- stubs.c (generated by _stubs.py): the typed stub loader.c answers for a marker's command, or NULL */
PFN_vkVoidFunction ls_icd_stub(const char *name);

/* ---- pipeline.c: shader modules, pipeline layouts, compute pipelines (the arbiter's programs), caches */
#define LS_ICD_MOST_SPIRV (LS_ICD_MAX_FRAME - 8192) /* a module's bytes: a frame, less its request's JSON */
/* Free what ``object`` (a shader, pipeline layout or pipeline) holds; a pipeline's program is freed at
 * the arbiter unless ``device`` is NULL (its session is gone). The lock held; the slot stays. */
void ls_icd_pipeline_object_free(struct ls_icd_device *device, struct ls_icd_object *object);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateShaderModule(VkDevice device, const VkShaderModuleCreateInfo *info,
                                                         const VkAllocationCallbacks *allocator, VkShaderModule *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyShaderModule(VkDevice device, VkShaderModule module,
                                                      const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreatePipelineLayout(VkDevice device, const VkPipelineLayoutCreateInfo *info,
                                                           const VkAllocationCallbacks *allocator,
                                                           VkPipelineLayout *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyPipelineLayout(VkDevice device, VkPipelineLayout layout,
                                                        const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateComputePipelines(VkDevice device, VkPipelineCache cache, uint32_t count,
                                                             const VkComputePipelineCreateInfo *infos,
                                                             const VkAllocationCallbacks *allocator,
                                                             VkPipeline *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyPipeline(VkDevice device, VkPipeline pipeline,
                                                  const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreatePipelineCache(VkDevice device, const VkPipelineCacheCreateInfo *info,
                                                          const VkAllocationCallbacks *allocator,
                                                          VkPipelineCache *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyPipelineCache(VkDevice device, VkPipelineCache cache,
                                                       const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPipelineCacheData(VkDevice device, VkPipelineCache cache, size_t *size,
                                                           void *data);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_MergePipelineCaches(VkDevice device, VkPipelineCache into, uint32_t count,
                                                          const VkPipelineCache *caches);

/* ---- descriptor.c and view.c: in descriptor.h (set layouts, pools, sets, updates, templates, buffer views) */

#endif
