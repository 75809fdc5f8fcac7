//! What can be checked about the shim without XRT: its C header is valid C99 and
//! C++17 on its own (bindgen and Rust see only the header), every declared
//! function is defined by the shim inside `guarded`, and the version rules behave.

use std::process::Command;

use xrt_sys::version::{
    parse_dotted, parse_version_header, parse_version_json, supports_register_xclbin,
};

fn compiler(cpp: bool) -> String {
    let var = if cpp { "CXX" } else { "CC" };
    std::env::var(var).unwrap_or_else(|_| if cpp { "g++" } else { "gcc" }.into())
}

fn syntax_check(cpp: bool) {
    let (lang, std) = if cpp {
        ("c++", "-std=c++17")
    } else {
        ("c", "-std=c99")
    };
    let output = Command::new(compiler(cpp))
        .args([
            std,
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-Werror",
            "-fsyntax-only",
            "-x",
            lang,
        ])
        .arg(xrt_sys::HEADER)
        .output()
        .expect("the build machine has a C and C++ compiler (gcc)");
    assert!(
        output.status.success(),
        "{} rejects {}:\n{}",
        compiler(cpp),
        xrt_sys::HEADER,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn header_is_valid_c99() {
    syntax_check(false);
}

#[test]
fn header_is_valid_cpp17() {
    syntax_check(true);
}

#[test]
fn every_header_function_is_implemented_by_the_shim() {
    let header = std::fs::read_to_string(xrt_sys::HEADER).unwrap();
    let shim = std::fs::read_to_string(xrt_sys::SHIM_SOURCE).unwrap();
    let declared: Vec<&str> = header
        .lines()
        .filter_map(|line| {
            let at = line.find("obx_")?;
            let rest = &line[at..];
            let name_end = rest.find('(')?;
            let name = &rest[..name_end];
            (!name.contains(' ') && !line.trim_start().starts_with("typedef")).then_some(name)
        })
        .collect();
    assert!(declared.len() >= 25, "found only {declared:?}");
    for name in declared {
        let defined = shim.lines().any(|line| {
            (line.starts_with("int ")
                || line.starts_with("void ")
                || line.starts_with("const char* "))
                && line.contains(&format!(" {name}("))
        });
        assert!(defined, "{name} has no definition line in the shim");
    }
}

#[test]
fn no_exception_escapes_the_shim() {
    // Every C entry point that can throw runs its body in `guarded`, which catches
    // everything; the close/free functions only delete objects whose destructors XRT
    // declares noexcept.
    let shim = std::fs::read_to_string(xrt_sys::SHIM_SOURCE).unwrap();
    let mut in_entry = None::<String>;
    let mut guarded = false;
    for line in shim.lines() {
        if line.starts_with("int obx_") {
            in_entry = Some(line.to_string());
            guarded = false;
        }
        if line.contains("return guarded(") {
            guarded = true;
        }
        if line == "}" {
            if let Some(entry) = in_entry.take() {
                assert!(guarded, "entry point without guarded(): {entry}");
            }
        }
    }
}

#[test]
fn versions_parse_from_every_source() {
    assert_eq!(parse_dotted("2.19.0"), Some((2, 19, 0)));
    assert_eq!(parse_dotted("2.17.319-rc1"), Some((2, 17, 319)));
    assert_eq!(parse_dotted("2.13"), Some((2, 13, 0)));
    assert_eq!(parse_dotted("two"), None);
    assert_eq!(parse_dotted(""), None);
    let header = "static const char xrt_build_version[] = \"2.18.0\";\nstatic const char xrt_build_version_branch[] = \"HEAD\";";
    assert_eq!(parse_version_header(header), Some((2, 18, 0)));
    assert_eq!(parse_version_header("nothing here"), None);
    let json = "{\n  \"BUILD_VERSION\" : \"2.17.319\",\n  \"BUILD_BRANCH\" : \"2024.1\"\n}";
    assert_eq!(parse_version_json(json), Some((2, 17, 319)));
    assert_eq!(parse_version_json("{}"), None);
}

#[test]
fn register_xclbin_needs_2_17() {
    assert!(!supports_register_xclbin((2, 13, 466)));
    assert!(!supports_register_xclbin((2, 16, 204)));
    assert!(supports_register_xclbin((2, 17, 0)));
    assert!(supports_register_xclbin((2, 19, 0)));
    assert!(supports_register_xclbin((3, 0, 0)));
}

/// `cargo check --features xrt` against this machine's (absent) and a fake old XRT:
/// the build stops with the one sentence that says why. Runs cargo in the workspace's
/// own target directory (cargo releases its lock while tests run) with the selection and
/// features of CI's clippy pass (`--workspace --all-targets --features onebit/xrt`), so
/// feature unification gives the very build dependencies (bindgen and its syn) that pass
/// compiled: xrt-sys's build script is the first thing to run, and stops the check. With
/// `-p xrt-sys` the host dependencies unified differently and were built again: 28 s of a
/// fresh CI run, 44 s in a target of its own. The system's pkg-config files are hidden so
/// only the given XRT is seen.
#[test]
fn the_xrt_feature_refuses_a_missing_or_old_xrt_by_name() {
    if std::path::Path::new("/opt/xilinx/xrt/include").is_dir() {
        test_support::skip!(
            "the_xrt_feature_refuses_a_missing_or_old_xrt_by_name",
            "this machine has /opt/xilinx/xrt"
        );
        return;
    }
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let empty = tempfile::tempdir().unwrap();
    let check = |xilinx_xrt: Option<&std::path::Path>| -> String {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&workspace)
            .args([
                "check",
                "--quiet",
                "--workspace",
                "--all-targets",
                "--features",
                "onebit/xrt",
            ])
            .env("CARGO_TARGET_DIR", workspace.join("target"))
            .env("PKG_CONFIG_PATH", empty.path())
            .env("PKG_CONFIG_LIBDIR", empty.path())
            .env_remove("ONEBIT_XRT_CHECK_ONLY")
            .env_remove("XILINX_XRT");
        if let Some(root) = xilinx_xrt {
            cmd.env("XILINX_XRT", root);
        }
        let out = cmd.output().expect("cargo runs");
        assert!(
            !out.status.success(),
            "the build should stop without a usable XRT"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = check(None);
    assert!(
        missing.contains("xrt-sys: the `xrt` feature needs XRT 2.17 or newer, and none was found via `pkg-config xrt`, $XILINX_XRT or /opt/xilinx/xrt"),
        "{missing}"
    );
    let old = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(old.path().join("include")).unwrap();
    std::fs::write(
        old.path().join("include/version.h"),
        "static const char xrt_build_version[] = \"2.13.0\";\n",
    )
    .unwrap();
    let too_old = check(Some(old.path()));
    assert!(
        too_old.contains("xrt-sys: XRT 2.13.0 (found via XILINX_XRT) is too old"),
        "{too_old}"
    );
}
