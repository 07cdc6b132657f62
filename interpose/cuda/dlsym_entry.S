/* The exported dlsym.

   glibc resolves RTLD_NEXT (and, for dlmopen namespaces, RTLD_DEFAULT)
   relative to the object that *called* dlsym, found from the return address.
   A C wrapper that forwards with an ordinary call makes libgpupool the
   caller: dlsym(RTLD_NEXT, "x") from another interposer then finds the wrong
   "next" definition, or itself, and loops (HAMi issue #2903, LLVM OpenMP's
   ompt_start_tool). So this entry never calls: it tail-jumps to the real
   dlsym, with the caller's return address untouched, for RTLD_NEXT,
   RTLD_DEFAULT, a NULL name and every name not starting with "cu". Only
   "cu..." lookups on a specific handle go to gpupool_dlsym_cu (dlsym.cpp),
   which may substitute a hook for a libcuda entry point. */
#if defined(__x86_64__)
        .text
        .globl  dlsym
        .type   dlsym, @function
        .p2align 4
dlsym:
        .cfi_startproc
        movq    gpupool_real_dlsym_ptr(%rip), %rax
        testq   %rax, %rax
        jz      3f
1:      cmpq    $-1, %rdi               /* RTLD_NEXT */
        je      2f
        testq   %rdi, %rdi              /* RTLD_DEFAULT */
        je      2f
        testq   %rsi, %rsi
        je      2f
        cmpb    $0x63, (%rsi)           /* 'c' */
        jne     2f
        cmpb    $0x75, 1(%rsi)          /* 'u' */
        jne     2f
        jmp     gpupool_dlsym_cu        /* hidden: a direct jump */
2:      jmp     *%rax
3:      /* First call: find the real dlsym (dlvsym), keeping our arguments.
           Entry %rsp is 8 mod 16: two pushes and 8 bytes realign it. */
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp
        .cfi_adjust_cfa_offset 8
        call    gpupool_resolve_real_dlsym
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testq   %rax, %rax
        jnz     1b
        ret                             /* no real dlsym: NULL */
        .cfi_endproc
        .size   dlsym, .-dlsym
#endif
        .section .note.GNU-stack,"",@progbits
