//! Builds the C++ shim over XRT and generates its Rust declarations, only with the
//! `xrt` feature. Without it nothing C++ is compiled.
//!
//! XRT is found via `pkg-config xrt`, then `$XILINX_XRT`, then `/opt/xilinx/xrt`,
//! and must be 2.17 or newer. `ONEBIT_XRT_CHECK_ONLY=1` generates the declarations
//! but neither compiles the shim nor links XRT: `cargo check --features xrt` on a
//! machine without XRT (CI does this to type-check the feature-gated code).

#[allow(dead_code)]
#[path = "src/version.rs"]
mod version;

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=shim/onebit_xrt.h");
    println!("cargo:rerun-if-changed=shim/onebit_xrt.cpp");
    println!("cargo:rerun-if-changed=src/version.rs");
    println!("cargo:rerun-if-env-changed=XILINX_XRT");
    println!("cargo:rerun-if-env-changed=ONEBIT_XRT_CHECK_ONLY");
    // Cargo sets CARGO_FEATURE_XRT exactly when the build script is compiled with
    // `feature = "xrt"`; without it nothing is built.
    #[cfg(feature = "xrt")]
    with_xrt::build();
}

/// An XRT installation: its root, include and library directories, and version.
#[allow(dead_code)]
struct Xrt {
    include: Vec<PathBuf>,
    lib: Vec<PathBuf>,
    version: (u32, u32, u32),
    found_by: String,
}

/// Stops the build with one sentence (no panic backtrace noise).
#[allow(dead_code)]
fn fail(sentence: &str) -> ! {
    eprintln!("{sentence}");
    std::process::exit(1);
}

#[allow(dead_code)]
fn find_xrt() -> Result<Xrt, String> {
    #[cfg(feature = "xrt")]
    if let Ok(library) = pkg_config::Config::new().cargo_metadata(false).probe("xrt") {
        if let Some(version) = version::parse_dotted(&library.version) {
            return Ok(Xrt {
                include: library.include_paths,
                lib: library.link_paths,
                version,
                found_by: "pkg-config xrt".into(),
            });
        }
    }
    let mut roots = Vec::new();
    if let Some(root) = std::env::var_os("XILINX_XRT") {
        roots.push((PathBuf::from(root), "XILINX_XRT"));
    }
    roots.push((PathBuf::from("/opt/xilinx/xrt"), "/opt/xilinx/xrt"));
    for (root, how) in roots {
        if !root.join("include").is_dir() {
            continue;
        }
        let version = version_of_root(&root).ok_or_else(|| {
            format!(
                "xrt-sys: found XRT at {} (via {how}) but could not read its version from include/version.h or version.json",
                root.display()
            )
        })?;
        return Ok(Xrt {
            include: vec![root.join("include")],
            lib: vec![root.join("lib"), root.join("lib64")],
            version,
            found_by: how.into(),
        });
    }
    Err("xrt-sys: the `xrt` feature needs XRT 2.17 or newer, and none was found via `pkg-config xrt`, $XILINX_XRT or /opt/xilinx/xrt; install the Ryzen AI XRT (see docs/npu.md) or build without `--features xrt`".into())
}

#[allow(dead_code)]
fn version_of_root(root: &Path) -> Option<(u32, u32, u32)> {
    let header = std::fs::read_to_string(root.join("include/version.h")).ok();
    header
        .as_deref()
        .and_then(version::parse_version_header)
        .or_else(|| {
            let json = std::fs::read_to_string(root.join("version.json")).ok()?;
            version::parse_version_json(&json)
        })
}

#[cfg(feature = "xrt")]
mod with_xrt {
    use super::*;

    pub fn build() {
        let check_only = std::env::var_os("ONEBIT_XRT_CHECK_ONLY").is_some();
        // Find and check XRT first: a missing or old XRT is the common failure, and its
        // sentence should not wait for (or hide behind) bindgen.
        let xrt = if check_only {
            None
        } else {
            let xrt = find_xrt().unwrap_or_else(|message| fail(&message));
            if !version::supports_register_xclbin(xrt.version) {
                let (major, minor, patch) = xrt.version;
                fail(&format!(
                    "xrt-sys: XRT {major}.{minor}.{patch} (found via {}) is too old: the Ryzen AI NPU needs xrt::device::register_xclbin and xrt::hw_context, which work from XRT {}.{}; Debian 12's libxrt-dev 2.13 is not enough, install AMD's Ryzen AI XRT (see docs/npu.md)",
                    xrt.found_by,
                    version::MINIMUM_XRT.0,
                    version::MINIMUM_XRT.1
                ));
            }
            Some(xrt)
        };

        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        let header = Path::new("shim/onebit_xrt.h");
        bindgen::Builder::default()
            .header(header.to_string_lossy())
            .allowlist_function("obx_.*")
            .allowlist_type("obx_.*")
            .allowlist_var("OBX_.*")
            .rustified_enum("obx_status")
            .prepend_enum_name(false)
            .generate()
            .unwrap_or_else(|e| {
                fail(&format!("xrt-sys: bindgen could not read shim/onebit_xrt.h (it needs libclang; on Debian `apt install libclang-dev`): {e}"))
            })
            .write_to_file(out.join("bindings.rs"))
            .expect("xrt-sys: cannot write bindings.rs to OUT_DIR");

        let Some(xrt) = xrt else {
            println!("cargo:warning=xrt-sys: ONEBIT_XRT_CHECK_ONLY is set: declarations generated, the shim is not compiled and XRT is not linked (good for `cargo check` only)");
            return;
        };
        let (major, minor, patch) = xrt.version;
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std("c++17")
            .file("shim/onebit_xrt.cpp")
            .include("shim")
            .define(
                "ONEBIT_XRT_VERSION",
                Some(format!("\"{major}.{minor}.{patch}\"").as_str()),
            );
        for dir in &xrt.include {
            build.include(dir);
        }
        build.compile("onebit_xrt");
        for dir in &xrt.lib {
            if dir.is_dir() {
                println!("cargo:rustc-link-search=native={}", dir.display());
            }
        }
        println!("cargo:rustc-link-lib=dylib=xrt_coreutil");
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }
}
