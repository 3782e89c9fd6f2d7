//! Where a uprobe on a function goes: on its first instruction, or on the second when the first
//! is one the kernel would have to single-step and the second one it emulates.
//!
//! x86-64 uprobes replace an instruction with `int3`. When the trap returns, the kernel must
//! execute the original instruction: it emulates a few (`push reg`, `jmp`, `jcc`, `call`, `nop`)
//! and single-steps any other in an out-of-line slot, which costs a second trap. Measured on this
//! kernel (6.18) with glibc 2.36's `free`, whose first instruction is `test %rdi,%rdi`: 6.2 µs
//! per call with the probe on it, 0.83 µs on the `je` that follows (a CPython loop of 1 M
//! malloc+free, `--event heap`: 7.9 s against 3.35 s; 0.65 s alone).
//!
//! The first instruction is skipped only when it changes neither the stack pointer, nor a
//! register that carries an argument (`rdi`, `rsi`, `rdx`, `rcx`, `r8`, `r9`), nor memory: the
//! programs then see the arguments and the stack of the function's entry. Anything else, or
//! code not recognised, keeps the probe on the entry.

/// The offset from a function's entry at which to put its uprobe, given its first bytes.
pub fn probe_offset(code: &[u8]) -> u64 {
    match harmless_len(code) {
        Some(len) if emulated(&code[len..]) => len as u64,
        _ => 0,
    }
}

/// The length of `code`'s first instruction when it only writes flags or a scratch register
/// (`rax`, `r10`, `r11`).
fn harmless_len(code: &[u8]) -> Option<usize> {
    let (rex, rest) = match code.first() {
        Some(&b) if b & 0xf0 == 0x40 => (b, &code[1..]),
        _ => (0, code),
    };
    let rex_len = usize::from(rex != 0);
    match *rest {
        // endbr64
        [0xf3, 0x0f, 0x1e, 0xfa, ..] if rex == 0 => Some(4),
        // test r, r (flags only)
        [0x85, modrm, ..] if modrm >> 6 == 3 => Some(rex_len + 2),
        // cmpb $imm8, disp32(%rip) (flags only)
        [0x80, 0x3d, ..] if rex == 0 && rest.len() >= 7 => Some(7),
        // mov r, r: harmless when the destination (ModRM.rm, REX.B) is a scratch register
        [0x89, modrm, ..] if modrm >> 6 == 3 && scratch(modrm & 7, rex & 1) => Some(rex_len + 2),
        // lea disp8(r), r: harmless when the destination (ModRM.reg, REX.R) is a scratch register
        [0x8d, modrm, ..]
            if modrm >> 6 == 1 && (modrm & 7) != 4 && scratch((modrm >> 3) & 7, (rex >> 2) & 1) =>
        {
            Some(rex_len + 3)
        }
        _ => None,
    }
    .filter(|&len| len <= code.len())
}

/// Whether register `low` (3 bits) with REX extension bit `high` is rax, r10 or r11.
fn scratch(low: u8, high: u8) -> bool {
    matches!((high, low), (0, 0) | (1, 2) | (1, 3))
}

/// Whether the kernel emulates the instruction at the start of `code` (no single step):
/// `push reg`, `jcc`, `jmp`, `call` and `nop`.
fn emulated(code: &[u8]) -> bool {
    matches!(
        *code,
        [0x41, 0x50..=0x57, ..]
            | [0x50..=0x57, ..]
            | [0x70..=0x7f, _, ..]
            | [0xeb, _, ..]
            | [0x90, ..]
            | [0x0f, 0x80..=0x8f, _, _, _, _, ..]
            | [0xe9 | 0xe8, _, _, _, _, ..]
    )
}

#[cfg(test)]
mod tests {
    use super::probe_offset;

    #[test]
    fn first_instructions_single_stepped_are_passed_when_harmless() {
        // glibc 2.36 free: test %rdi,%rdi; je
        assert_eq!(
            probe_offset(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0]),
            3
        );
        // CPython 3.11 _PyObject_Free: test %rsi,%rsi; je rel8
        assert_eq!(probe_offset(&[0x48, 0x85, 0xf6, 0x74, 0x7b]), 3);
        // glibc memalign: cmpb $0x0,0x140e71(%rip); je
        assert_eq!(
            probe_offset(&[0x80, 0x3d, 0x71, 0x0e, 0x14, 0, 0, 0x74, 0x07]),
            7
        );
        // glibc mmap: mov %ecx,%r10d; then test $0xfff,%r9d (single-stepped too): stays
        assert_eq!(
            probe_offset(&[0x41, 0x89, 0xca, 0x41, 0xf7, 0xc1, 0xff, 0x0f, 0, 0]),
            0
        );
        // mov %ecx,%r10d; push %rbx
        assert_eq!(probe_offset(&[0x41, 0x89, 0xca, 0x53]), 3);
        // CPython 3.11 _PyObject_Malloc: lea -0x1(%rsi),%rax; push %rbx
        assert_eq!(probe_offset(&[0x48, 0x8d, 0x46, 0xff, 0x53]), 4);
        // endbr64; push %rbp
        assert_eq!(probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55]), 4);
    }

    #[test]
    fn entries_emulated_or_unknown_keep_the_probe() {
        // glibc malloc: push %r12
        assert_eq!(probe_offset(&[0x41, 0x54, 0x55]), 0);
        // mov %rdi,%rax is harmless but mov %rsi,%rdi writes an argument
        assert_eq!(probe_offset(&[0x48, 0x89, 0xf7, 0x53]), 0);
        // lea -0x1(%rsi),%rdi writes an argument
        assert_eq!(probe_offset(&[0x48, 0x8d, 0x7e, 0xff, 0x53]), 0);
        // sub $8,%rsp moves the stack
        assert_eq!(probe_offset(&[0x48, 0x83, 0xec, 0x08, 0x53]), 0);
        // mov %rax,%r8 and lea -0x1(%rax),%r8 write an argument (REX.B, REX.R)
        assert_eq!(probe_offset(&[0x49, 0x89, 0xc0, 0x53]), 0);
        assert_eq!(probe_offset(&[0x4c, 0x8d, 0x40, 0xff, 0x53]), 0);
        // cut short
        assert_eq!(probe_offset(&[0x48, 0x85]), 0);
        assert_eq!(probe_offset(&[0x48, 0x85, 0xff, 0x0f, 0x84]), 0);
        assert_eq!(probe_offset(&[]), 0);
    }
}
