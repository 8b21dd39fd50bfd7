"""Native (C++) pieces built on the user's machine: the eager autograd node
(`backward`, `build`, `ffi_backward.cpp`)."""
