"""Native (C++) pieces built on the user's machine, one torch extension (`build`): the
eager autograd node (`backward`, `ffi_backward.cpp`) and the eager forward launch
(`launch`, `ffi_launch.cpp`)."""
