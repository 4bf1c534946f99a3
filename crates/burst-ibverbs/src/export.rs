//! Versioned exports: every public symbol is a `.symver` alias of a private
//! Rust function, so it reaches `.dynsym` as `name@@VERSION` exactly as in
//! rdma-core's libraries (design/ibverbs-abi.md §3.2: rust-lld, empty version
//! nodes from `exports.map`, never `#[no_mangle]`).

/// Exports `$f` as the default version `$name@@$ver`.
macro_rules! export {
    ($name:literal, $ver:literal, $f:path) => {
        core::arch::global_asm!(
            ".globl {0}",
            concat!(".symver {0}, ", $name, "@@", $ver),
            sym $f,
        );
    };
}

/// Exports `$f` as the hidden compat version `$name@$ver` (an older ABI of
/// a name whose default version is another function).
macro_rules! export_compat {
    ($name:literal, $ver:literal, $f:path) => {
        core::arch::global_asm!(
            ".globl {0}",
            concat!(".symver {0}, ", $name, "@", $ver),
            sym $f,
        );
    };
}

/// How an unsupported entry point reports failure, by its C return type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fail {
    /// Pointer: NULL, errno set.
    Null,
    /// `int` returning an errno value (rdma-core's newer calls).
    Errno,
    /// `int`/`ssize_t` returning -1, errno set.
    Minus1,
    /// `void`.
    Void,
}

/// Defines and exports stubs for calls burst does not support: each logs
/// once and fails with `$errno` the way its C signature reports errors.
macro_rules! stubs {
    ($errno:expr; $( $id:ident = $name:literal @ $ver:literal $(($compat:ident))? => $kind:ident; )*) => {
        $(
            unsafe extern "C" fn $id() -> usize {
                static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                crate::export::unsupported($name, &SEEN, $errno, crate::export::Fail::$kind)
            }
            stubs!(@export $name, $ver, $id $(, $compat)?);
        )*
    };
    (@export $name:literal, $ver:literal, $id:ident) => { export!($name, $ver, $id); };
    (@export $name:literal, $ver:literal, $id:ident, compat) => { export_compat!($name, $ver, $id); };
}

/// The body of every stub: a clear log line once, then the failure value
/// in the register the caller reads (`rax`: -1 as 64 bits serves both
/// `int` and `ssize_t` callers).
pub(crate) fn unsupported(
    name: &str,
    seen: &std::sync::atomic::AtomicBool,
    errno: i32,
    kind: Fail,
) -> usize {
    if !seen.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::log_line(&format!(
            "{name} is not supported by burst (returns {})",
            match errno {
                libc::ENOSYS => "ENOSYS",
                _ => "EOPNOTSUPP",
            }
        ));
    }
    match kind {
        Fail::Null => {
            crate::set_errno(errno);
            0
        }
        Fail::Errno => errno as usize,
        Fail::Minus1 => {
            crate::set_errno(errno);
            usize::MAX
        }
        Fail::Void => 0,
    }
}
