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
 *   physical.c  VkPhysicalDevice: properties, features, queue family, memory, formats
 *   device.c    VkDevice: what vkCreateDevice checks (it refuses every device for now)
 *
 * Dispatchable objects (VkInstance, VkPhysicalDevice) begin with the loader's VK_LOADER_DATA
 * slot, set to ICD_LOADER_MAGIC when made; the loader writes its dispatch table there.
 * Functions return a VkResult, or a count, 0 or a negative errno. No Python runs in here.
 * docs/icd.md has the design. */
#ifndef LIBSHARE_ICD_H
#define LIBSHARE_ICD_H

#include <stddef.h>
#include <stdint.h>
#include <vulkan/vulkan.h>
#include <vulkan/vk_icd.h>

#define LS_ICD_API_VERSION VK_API_VERSION_1_1 /* what the driver implements of the physical-device queries */
#define LS_ICD_DEVICE_PREFIX "libshare: "
#define LS_ICD_MAX_FDS 4                      /* wire.py's MAX_FDS */
#define LS_ICD_MAX_FRAME (4u << 20)           /* wire.py's MAX_FRAME */
#define LS_ICD_REPLY_MS 60000                 /* client/exchange.py's REPLY_TIMEOUT */
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
int ls_icd_send(int sock, const char *json, size_t json_len);
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

struct ls_icd_physical {
    VK_LOADER_DATA loader; /* first: the loader's slot */
    struct ls_icd_instance *instance;
    VkPhysicalDeviceProperties properties; /* the real device's, name and version ours */
    VkPhysicalDeviceFeatures features;     /* what the arbiter keeps safe */
    VkPhysicalDevice16BitStorageFeatures storage16; /* (its sType and pNext unused) */
    VkSubgroupFeatureFlags subgroup_operations;     /* in the compute stage */
    uint32_t subgroup_size;
    uint32_t max_per_set_descriptors;
    uint64_t max_allocation;
    uint8_t uuid[VK_UUID_SIZE];
    uint32_t timestamp_valid_bits;
    uint64_t memory; /* the device-local heap: the session's memory limit */
};

struct ls_icd_session {
    int sock;     /* the session's control socket */
    int ring_fd;  /* the ring's memfd (kept for the data path to map) */
    int bell_fd;  /* the doorbell */
    int64_t client_id;
};

VkResult ls_icd_hello(struct ls_icd_session *session, struct ls_icd_physical *physical, char *why, size_t why_size);
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

/* ---- physical.c */
int ls_icd_feature_set(struct ls_icd_physical *physical, const char *name);
size_t ls_icd_off_size(VkStructureType type);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceProperties(VkPhysicalDevice pd, VkPhysicalDeviceProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceProperties2(VkPhysicalDevice pd, VkPhysicalDeviceProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures(VkPhysicalDevice pd, VkPhysicalDeviceFeatures *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures2(VkPhysicalDevice pd, VkPhysicalDeviceFeatures2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceQueueFamilyProperties(VkPhysicalDevice pd, uint32_t *count,
                                                                         VkQueueFamilyProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceQueueFamilyProperties2(VkPhysicalDevice pd, uint32_t *count,
                                                                          VkQueueFamilyProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceMemoryProperties(VkPhysicalDevice pd,
                                                                    VkPhysicalDeviceMemoryProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceMemoryProperties2(VkPhysicalDevice pd,
                                                                     VkPhysicalDeviceMemoryProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFormatProperties(VkPhysicalDevice pd, VkFormat format,
                                                                    VkFormatProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFormatProperties2(VkPhysicalDevice pd, VkFormat format,
                                                                     VkFormatProperties2 *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPhysicalDeviceImageFormatProperties(
    VkPhysicalDevice pd, VkFormat format, VkImageType type, VkImageTiling tiling, VkImageUsageFlags usage,
    VkImageCreateFlags flags, VkImageFormatProperties *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPhysicalDeviceImageFormatProperties2(
    VkPhysicalDevice pd, const VkPhysicalDeviceImageFormatInfo2 *info, VkImageFormatProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceSparseImageFormatProperties(
    VkPhysicalDevice pd, VkFormat format, VkImageType type, VkSampleCountFlagBits samples, VkImageUsageFlags usage,
    VkImageTiling tiling, uint32_t *count, VkSparseImageFormatProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceSparseImageFormatProperties2(
    VkPhysicalDevice pd, const VkPhysicalDeviceSparseImageFormatInfo2 *info, uint32_t *count,
    VkSparseImageFormatProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalBufferProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalBufferInfo *info, VkExternalBufferProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalFenceProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalFenceInfo *info, VkExternalFenceProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalSemaphoreProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalSemaphoreInfo *info, VkExternalSemaphoreProperties *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateDeviceExtensionProperties(VkPhysicalDevice pd, const char *layer,
                                                                        uint32_t *count,
                                                                        VkExtensionProperties *out);
/* ---- device.c */
VkResult ls_icd_check_device(const struct ls_icd_physical *physical, const VkDeviceCreateInfo *info);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *info,
                                                   const VkAllocationCallbacks *allocator, VkDevice *out);

#endif
