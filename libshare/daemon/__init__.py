"""The control daemon (``libshare-control -d``): supervises arbiters; imports nothing of the engine or Vulkan."""
