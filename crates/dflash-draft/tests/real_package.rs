//! The real-package arm (upstream's 111-check arm): a directory from
//! `ONEBIT_TEST_DFLASH_DRAFT`, or else the full-size synthetic Bolt package that
//! `cargo xtask fixtures` writes to `target/fixtures/bolt-draft`. Skipped by name when
//! neither exists. Prints the inventory line, decodes every projection weight, and
//! checks the fusion orientation by the agreement pattern of the two readings.

use std::path::PathBuf;
use std::time::Instant;

use dflash_draft::{fusion_orientation, load_draft, Projection};

#[test]
fn real_package_arm() {
    let dir = std::env::var_os("ONEBIT_TEST_DFLASH_DRAFT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures/bolt-draft")
        });
    if !dir.join("config.json").exists() {
        test_support::skip!(
            "real_package_arm",
            "no package at {} (set ONEBIT_TEST_DFLASH_DRAFT or run `cargo xtask fixtures`)",
            dir.display()
        );
        return;
    }
    let start = Instant::now();
    let draft = load_draft(&dir).unwrap();
    println!("real package: {}", draft.inventory_line());
    let c = &draft.config;
    let mut weights = 0usize;
    for layer in 0..c.num_layers {
        for which in Projection::ALL {
            let values = draft.decode_projection(layer, which).unwrap();
            let (n, k) = which.shape(c);
            assert_eq!(values.len(), n * k);
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{}",
                which.tensor_name(layer)
            );
            weights += values.len();
        }
    }
    println!("decoded {weights} projection weights");
    if c.hidden_size == 2560 && c.num_layers == 5 {
        assert_eq!(weights, 327_680_000);
        assert_eq!(draft.tensor_count(), 64);
    }
    let o = fusion_orientation(&draft).unwrap();
    println!(
        "fusion neighbours, declared order: next row {:.4}, 32 rows on {:.4}, next column {:.4}, 32 columns on {:.4}",
        o.declared[0], o.declared[1], o.declared[2], o.declared[3]
    );
    println!(
        "fusion neighbours, plain reading:  next row {:.4}, 32 rows on {:.4}, next column {:.4}, 32 columns on {:.4}",
        o.plain[0], o.plain[1], o.plain[2], o.plain[3]
    );
    assert!(
        o.confirms_declared_order(),
        "the declared order must read consistently and the plain one contradict itself: {o:?}"
    );
    println!("real package arm: {:.1} s", start.elapsed().as_secs_f64());
}
