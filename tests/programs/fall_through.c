/* Functions that end without a jump: `head_part` runs off its end into `tail_part`, as
 * libc's strcasecmp runs into strcasecmp_l. `ends_in_ret` returns before the function
 * after it, so no range may run from one into the other. Written in assembly without
 * CFI, as such code often is: stripped, no .eh_frame covers it. */
__asm__(
    "    .text\n"
    "    .p2align 4\n"
    "    .globl head_part\n"
    "    .type head_part, @function\n"
    "head_part:\n"
    "    lea 1(%rdi), %rax\n"
    "    imul $3, %rax, %rax\n"
    "    .size head_part, .-head_part\n"
    "    .globl tail_part\n"
    "    .type tail_part, @function\n"
    "tail_part:\n"
    "    add %rsi, %rax\n"
    "    xor $5, %rax\n"
    "    ret\n"
    "    .size tail_part, .-tail_part\n"
    "    .globl ends_in_ret\n"
    "    .type ends_in_ret, @function\n"
    "ends_in_ret:\n"
    "    mov %rdi, %rax\n"
    "    ret\n"
    "    .size ends_in_ret, .-ends_in_ret\n"
    "    .globl after_ret\n"
    "    .type after_ret, @function\n"
    "after_ret:\n"
    "    lea 2(%rsi), %rax\n"
    "    ret\n"
    "    .size after_ret, .-after_ret\n");

long head_part(long x, long y);
long ends_in_ret(long x);
long after_ret(long x, long y);

int main(int argc, char **argv) {
    (void)argv;
    long n = argc > 1 ? 400000 : 200000, s = 0;
    for (long i = 0; i < n; i++)
        s += head_part(i, s) + ends_in_ret(i) + after_ret(i, s);
    return (int)(s & 1);
}
