//! llama.cpp as an outside reference, built from PyPI's pinned llama-cpp-python sdist
//! (which vendors it): the download, the build tools and the build of one tool target
//! (`llama-bench` for `bench-peer`, `llama-tokenize` for `tokenize-reference`), all
//! under `target/peer/` (never committed; later runs reuse what is there). Progress and
//! errors name the step; each step's full output goes to a log beside it.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The llama-cpp-python release whose vendored llama.cpp is the peer (August 2025,
/// `tools/llama-bench` with `-d`). Later 0.3.x sdists vendor six times the sources,
/// which takes too long to build on a two-core machine; bumping is this one line (and
/// perhaps the cmake options below).
pub const LLAMA_CPP_PYTHON: &str = "0.3.16";
/// cmake and ninja from PyPI when the system has none (wheels only).
const CMAKE_PIN: &str = "cmake==3.31.10";
const NINJA_PIN: &str = "ninja==1.13.0";

/// Progress goes to stderr (`bench-peer --json` keeps stdout for its object).
macro_rules! step {
    ($($t:tt)*) => { eprintln!("llama.cpp: {}", format!($($t)*)) };
}

/// `target/peer`, created.
pub fn peer_dir() -> Result<PathBuf> {
    let peer = crate::workspace_root().join("target/peer");
    std::fs::create_dir_all(&peer)
        .with_context(|| format!("llama.cpp: cannot create {}", peer.display()))?;
    Ok(peer)
}

/// Runs `cmd` with its output appended to `log`; on failure prints the log's last lines
/// and names the step, the command and the log.
pub fn logged(step: &str, cmd: &mut Command, log: &Path) -> Result<()> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("llama.cpp: cannot open the log {}", log.display()))?;
    let shown = format!("{cmd:?}");
    let st = cmd
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .with_context(|| format!("llama.cpp: step '{step}': cannot start {shown}"))?;
    if !st.success() {
        eprintln!("--- last 30 lines of {} ---", log.display());
        if let Ok(f) = File::open(log) {
            let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
            for l in &lines[lines.len().saturating_sub(30)..] {
                eprintln!("{l}");
            }
        }
        bail!(
            "llama.cpp: step '{step}' failed ({st}): {shown}; full log in {}",
            log.display()
        );
    }
    Ok(())
}

fn works(program: &Path, arg: &str) -> bool {
    works_args(program, &[arg])
}

fn works_args(program: &Path, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The llama.cpp source tree inside the unpacked sdist, downloading it if needed.
fn ensure_sdist(peer: &Path) -> Result<PathBuf> {
    let src = peer.join(format!("llama-cpp-python-{LLAMA_CPP_PYTHON}"));
    let llama = src.join("vendor/llama.cpp");
    if llama.join("tools/llama-bench/llama-bench.cpp").exists() {
        return Ok(llama);
    }
    let py = crate::python(
        "llama.cpp",
        "pip downloads llama-cpp-python, and cmake when missing",
    )?;
    let downloads = peer.join("downloads");
    std::fs::create_dir_all(&downloads)?;
    let tarball = downloads.join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"));
    let log = peer.join("download.log");
    if !tarball.exists() {
        step!(
            "  pip download llama-cpp-python=={LLAMA_CPP_PYTHON} (sdist, ~50 MB; log {})",
            log.display()
        );
        // `--no-binary` names only this package: the sdist's build backend still comes
        // as wheels (`:all:` would compile cmake from source to prepare its metadata).
        logged(
            "download the llama-cpp-python sdist",
            Command::new(&py)
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--disable-pip-version-check",
                ])
                .args(["--no-binary", "llama-cpp-python", "-d"])
                .arg(&downloads)
                .arg(format!("llama-cpp-python=={LLAMA_CPP_PYTHON}")),
            &log,
        )?;
        if !tarball.exists() {
            bail!(
                "llama.cpp: pip reported success but {} is missing",
                tarball.display()
            );
        }
    }
    step!("  unpacking {}", tarball.display());
    let staging = peer.join("unpack.partial");
    let _ = std::fs::remove_dir_all(&staging);
    let script = "import sys, tarfile\nt = tarfile.open(sys.argv[1])\n\
                  kw = {'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}\n\
                  t.extractall(sys.argv[2], **kw)\n";
    logged(
        "unpack the sdist",
        Command::new(&py)
            .arg("-c")
            .arg(script)
            .arg(&tarball)
            .arg(&staging),
        &log,
    )?;
    let inner = staging.join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}"));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::rename(&inner, &src).with_context(|| {
        format!(
            "llama.cpp: cannot move {} to {}",
            inner.display(),
            src.display()
        )
    })?;
    let _ = std::fs::remove_dir_all(&staging);
    if !llama.join("tools/llama-bench/llama-bench.cpp").exists() {
        bail!(
            "llama.cpp: the sdist has no vendor/llama.cpp/tools/llama-bench under {}",
            src.display()
        );
    }
    Ok(llama)
}

/// cmake and ninja: the system's, or a venv's under `target/peer/venv`.
fn build_tools(peer: &Path) -> Result<(PathBuf, PathBuf)> {
    let venv_bin = peer.join("venv/bin");
    let find = |name: &str| -> Option<PathBuf> {
        let local = venv_bin.join(name);
        if works(&local, "--version") {
            return Some(local);
        }
        works(Path::new(name), "--version").then(|| PathBuf::from(name))
    };
    let (cmake, ninja) = (find("cmake"), find("ninja"));
    if let (Some(c), Some(n)) = (&cmake, &ninja) {
        return Ok((c.clone(), n.clone()));
    }
    let log = peer.join("venv.log");
    let venv = peer.join("venv");
    // A venv whose creation was interrupted has a python but no pip: make it again.
    if !works_args(&venv_bin.join("python"), &["-m", "pip", "--version"]) {
        let _ = std::fs::remove_dir_all(&venv);
        step!("  python -m venv {}", venv.display());
        logged(
            "create the build-tools venv",
            Command::new(crate::python(
                "llama.cpp",
                "pip downloads llama-cpp-python, and cmake when missing",
            )?)
            .args(["-m", "venv"])
            .arg(&venv),
            &log,
        )?;
    }
    let mut wanted = Vec::new();
    if cmake.is_none() {
        wanted.push(CMAKE_PIN);
    }
    if ninja.is_none() {
        wanted.push(NINJA_PIN);
    }
    step!("  pip install {} into {}", wanted.join(" "), venv.display());
    logged(
        "install cmake/ninja from PyPI",
        Command::new(venv_bin.join("python"))
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .args(["--only-binary", ":all:"])
            .args(&wanted),
        &log,
    )?;
    let c = cmake.unwrap_or_else(|| venv_bin.join("cmake"));
    let n = ninja.unwrap_or_else(|| venv_bin.join("ninja"));
    Ok((c, n))
}

/// Which llama.cpp build: the sdist's default (`-DGGML_NATIVE=ON`: every ISA extension
/// of this CPU), or AVX2 and FMA only — on AVX-512 VMs the AVX2 build decodes faster
/// (the brief: compare against the peer's best).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    Native,
    Avx2,
}

impl Build {
    /// The build whose [`name`](Build::name) is `name`.
    pub fn named(name: &str) -> Option<Build> {
        [Build::Native, Build::Avx2]
            .into_iter()
            .find(|b| b.name() == name)
    }

    /// The name `--llama-build` takes and reports print.
    pub fn name(self) -> &'static str {
        match self {
            Build::Native => "native",
            Build::Avx2 => "avx2",
        }
    }

    fn dir(self) -> String {
        match self {
            Build::Native => format!("build-{LLAMA_CPP_PYTHON}"),
            Build::Avx2 => format!("build-{LLAMA_CPP_PYTHON}-avx2"),
        }
    }

    fn cmake_flags(self) -> &'static [&'static str] {
        match self {
            Build::Native => &["-DGGML_NATIVE=ON"],
            Build::Avx2 => &[
                "-DGGML_NATIVE=OFF",
                "-DGGML_AVX=ON",
                "-DGGML_AVX2=ON",
                "-DGGML_FMA=ON",
                "-DGGML_F16C=ON",
                "-DGGML_BMI2=ON",
                "-DGGML_AVX512=OFF",
            ],
        }
    }
}

/// `target/peer/build-<version>[-avx2]/bin/<tool>`: llama.cpp's CMake target `tool` (such
/// as `llama-bench` or `llama-tokenize`) built alone, unless it is already there. One
/// build tree per [`Build`] serves every tool (configured once with the same options).
pub fn ensure_tool(peer: &Path, tool: &str, flavour: Build) -> Result<PathBuf> {
    let build = peer.join(flavour.dir());
    let bin = build.join("bin").join(tool);
    if bin.exists() {
        step!("  reusing {}", bin.display());
        return Ok(bin);
    }
    let llama = ensure_sdist(peer)?;
    let (cmake, ninja) = build_tools(peer)?;
    let log = peer.join(format!("{}-{tool}.log", flavour.dir()));
    let _ = std::fs::remove_file(&log);
    step!("  cmake configure (log {})", log.display());
    let mut configure = Command::new(&cmake);
    configure
        .arg("-S")
        .arg(&llama)
        .arg("-B")
        .arg(&build)
        .args(["-G", "Ninja"])
        .arg(format!("-DCMAKE_MAKE_PROGRAM={}", ninja.display()))
        .args([
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DGGML_CCACHE=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=OFF",
        ])
        .args(flavour.cmake_flags())
        // The 0.3.16 sdist ships vendor/llama.cpp/.git (a shallow clone: the commit is
        // right, the build number is 1); should a release ship none, the ceiling keeps
        // llama.cpp's build-info from finding *this* repository above target/ and
        // stamping onebit's commit on the tool.
        .env("GIT_CEILING_DIRECTORIES", peer);
    logged("cmake configure llama.cpp", &mut configure, &log)?;
    step!("  cmake --build --target {tool} -j 2 (several minutes on two cores)");
    logged(
        &format!("build {tool}"),
        Command::new(&cmake)
            .arg("--build")
            .arg(&build)
            .args(["--target", tool, "-j", "2"])
            .env("GIT_CEILING_DIRECTORIES", peer),
        &log,
    )?;
    if !bin.exists() {
        bail!(
            "llama.cpp: the build finished but {} is missing; see {}",
            bin.display(),
            log.display()
        );
    }
    Ok(bin)
}
