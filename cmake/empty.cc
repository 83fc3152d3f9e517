// libloadstone.so is made of the static libraries linked into it whole; a shared library
// target needs one source of its own.
