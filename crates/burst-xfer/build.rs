//! With feature `libibverbs`: the C shim through which sessions reach the
//! system's libibverbs (its data-path verbs are inline functions of the
//! header).
fn main() {
    println!("cargo:rerun-if-changed=csrc/ibv_shim.c");
    if std::env::var_os("CARGO_FEATURE_LIBIBVERBS").is_some() {
        #[cfg(feature = "libibverbs")]
        cc::Build::new()
            .file("csrc/ibv_shim.c")
            .warnings(true)
            .compile("burst_xfer_ibv_shim");
        println!("cargo:rustc-link-lib=ibverbs");
    }
}
