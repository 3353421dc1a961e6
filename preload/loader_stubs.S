/* dlsym and dlopen as the shim exports them, in assembly because both must reach glibc with the
 * caller's return address intact: glibc resolves RTLD_NEXT, and dlopen's search path (the
 * caller's DT_RPATH / DT_RUNPATH, $ORIGIN), from the address its caller returns to. A C wrapper
 * would make that the shim. So:
 *   dlsym(RTLD_NEXT, ...)  tail-jumps to glibc's dlsym (caller kept; never wrapped);
 *   dlsym(handle, ...)     tail-jumps to the C hook (loader_hooks.cpp), which may wrap the result;
 *   dlopen                 tail-jumps through a pointer: glibc's dlopen, or the torch watch while
 *                          VRAMLEDGER_PRELOAD_INSTALL_TORCH=1 waits for libc10_cuda. */

#if defined(__x86_64__)
  .text
  .globl dlsym
  .type dlsym, @function
dlsym:
  cmpq $-1, %rdi                 /* RTLD_NEXT is (void*)-1 in glibc */
  je 1f
  jmp vramledger_preload_dlsym_hook
1:
  jmp *vramledger_preload_dlsym_next_target(%rip)
  .size dlsym, .-dlsym

  .globl dlopen
  .type dlopen, @function
dlopen:
  jmp *vramledger_preload_dlopen_target(%rip)
  .size dlopen, .-dlopen

#elif defined(__aarch64__)
  .text
  .globl dlsym
  .type dlsym, %function
dlsym:
  cmn x0, #1
  b.eq 1f
  b vramledger_preload_dlsym_hook
1:
  adrp x16, vramledger_preload_dlsym_next_target
  ldr x16, [x16, :lo12:vramledger_preload_dlsym_next_target]
  br x16
  .size dlsym, .-dlsym

  .globl dlopen
  .type dlopen, %function
dlopen:
  adrp x16, vramledger_preload_dlopen_target
  ldr x16, [x16, :lo12:vramledger_preload_dlopen_target]
  br x16
  .size dlopen, .-dlopen

#else
#error "loader_stubs.S: only x86-64 and aarch64 are supported"
#endif

  .section .note.GNU-stack,"",%progbits
