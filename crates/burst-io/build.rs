//! Builds the XDP steering program (`ebpf/xdp_roce.bpf.c`) with clang when
//! the `af-xdp` feature is on, and binds DPDK with the `dpdk` feature; the
//! default build compiles no C.

fn main() {
    #[cfg(feature = "af-xdp")]
    af_xdp::build();
    #[cfg(feature = "dpdk")]
    dpdk::build();
}

#[cfg(feature = "af-xdp")]
mod af_xdp {
    use std::path::PathBuf;

    pub fn build() {
        let manifest =
            PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let src = manifest.join("ebpf/xdp_roce.bpf.c");
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

#[cfg(feature = "dpdk")]
mod dpdk {
    use std::path::PathBuf;

    /// Binds Debian's libdpdk-dev (22.11) with bindgen; DPDK's fast path is
    /// static inline, so bindgen also writes C wrappers for those functions
    /// (`wrap_static_fns`), compiled here with DPDK's own flags.
    pub fn build() {
        let lib = pkg_config::Config::new()
            .probe("libdpdk")
            .unwrap_or_else(|e| panic!("DPDK not found (apt-get install libdpdk-dev): {e}"));
        // The verbatim cflags (they include `-include rte_config.h` and
        // `-march=corei7`, which DPDK's headers need).
        let out = std::process::Command::new("pkg-config")
            .args(["--cflags", "libdpdk"])
            .output()
            .expect("pkg-config runs");
        let flags: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let manifest =
            PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let wrapper = manifest.join("dpdk/wrapper.h");
        println!("cargo:rerun-if-changed={}", wrapper.display());
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
        let statics = out.join("dpdk_static_fns");
        let b = bindgen::Builder::default()
            .header(wrapper.to_string_lossy())
            .clang_args(&flags)
            .clang_arg("-DALLOW_EXPERIMENTAL_API")
            .allowlist_function("rte_dma_.*|rte_eal_init|rte_eal_cleanup|rte_eth_.*|rte_pktmbuf_.*|rte_mempool_.*|rte_socket_id|rte_strerror|burst_rte_errno|rte_lcore_id|rte_thread_register|rte_eth_link_get_nowait")
            .allowlist_type("rte_dma_.*|rte_mbuf|rte_mempool|rte_eth_.*|rte_ether_addr")
            .allowlist_var("RTE_ETH_.*|RTE_MBUF_.*|RTE_PKTMBUF_HEADROOM")
            .derive_default(true)
            .layout_tests(false)
            // DPDK's comments would become doctests of C prose.
            .generate_comments(false)
            .generate_inline_functions(true)
            .wrap_static_fns(true)
            .wrap_static_fns_path(&statics)
            .generate()
            .expect("bindgen over DPDK's headers");
        b.write_to_file(out.join("dpdk_bindings.rs"))
            .expect("write bindings");
        let mut cc = cc::Build::new();
        cc.file(statics.with_extension("c"))
            .include(manifest.join("dpdk"))
            .flag("-DALLOW_EXPERIMENTAL_API")
            .warnings(false);
        for f in &flags {
            cc.flag(f);
        }
        cc.compile("burst_dpdk_static_fns");
        let _ = lib;
    }
}
