"""Scripts Intel CI runs on machines with Intel GPUs: install XPU torch, check the devices, run the XPU tier."""
