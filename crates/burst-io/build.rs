//! Builds the XDP steering program (`ebpf/xdp_roce.bpf.c`) with clang when
//! the `af-xdp` feature is on; the default build compiles no C.

fn main() {
    #[cfg(feature = "af-xdp")]
    af_xdp::build();
}

#[cfg(feature = "af-xdp")]
mod af_xdp {
    use std::path::PathBuf;

    pub fn build() {
        let manifest =
            PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let src = manifest.join("../../ebpf/xdp_roce.bpf.c");
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
        println!("cargo:rerun-if-changed={}", src.display());
        libbpf_cargo::SkeletonBuilder::new()
            .source(&src)
            .obj(out.join("xdp_roce.bpf.o"))
            // Debian keeps <asm/types.h> in the multiarch directory.
            .clang_args(["-I/usr/include/x86_64-linux-gnu"])
            .build()
            .unwrap_or_else(|e| {
                panic!(
                    "building {} failed (needs clang and libbpf headers: \
                     apt-get install clang libbpf-dev): {e:#}",
                    src.display()
                )
            });
    }
}
