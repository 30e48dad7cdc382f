"""The machine: probes (host memory and limits, OpenCL, sysfs, llama.cpp's --list-devices, the binaries
themselves) and the choice of the device llama.cpp will use (`target_device`, pure: probed facts in, a target
out). `proc` is the one door to short-lived subprocesses for probing.

Owns what is true of this machine. Must not plan, launch or print to the user."""
