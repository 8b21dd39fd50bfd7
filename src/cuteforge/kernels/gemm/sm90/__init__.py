"""The sm_90a kernel: config, device code, host entry."""
